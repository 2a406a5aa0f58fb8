// Strategies small enough for unit tests that train in process: a few steps of synthetic data,
// one thread, no evaluation or checkpoints unless a test asks.
#pragma once

#include <string>

#include "strata/core/strategy.h"

namespace strata::test {

// [job] (without a model: the test names it, in a --set or through the library API) and [data].
inline constexpr const char* kTinyJob = R"(
[job]
dataset = "synthetic"
steps = 3
global_batch = 4
eval_every = 0
checkpoint_every = 0
log_every = 100
threads = 1
[data]
vocab_size = 32
)";

// The bundled GPT at its smallest; train it with the override kTinyGptModel.
inline const std::string kTinyGpt = std::string(kTinyJob) + R"(
[model]
n_layer = 1
n_head = 2
d_model = 16
vocab_size = 32
seq_len = 8
)";
inline const StringList kTinyGptModel{"job.model=gpt"};

}  // namespace strata::test
