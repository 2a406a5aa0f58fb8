// Core's step program: what one training step runs before any pass owns or wraps a stage. With
// the plan's "Step program" (strata plan), this file is the step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sampler.h"
#include "strata/job.h"

namespace strata::engine {

// How this rank cuts its share of the global batch.
struct BatchShape {
  int64_t micro_batch = 0;  // windows per micro-batch
  int64_t micro_count = 0;  // micro-batches per step
};

// Sets the job's loss, loss reduction, batch split, gradient list and validation batches to
// core's, and provides every stage of the step program. `sampler` and `optimizer` (built once
// passes are applied) are read when the stages run and must outlive the job's program.
void provide_core_step(Job& job, BatchSampler& sampler, const std::unique_ptr<Optimizer>& optimizer, BatchShape shape);

// The optimizer's parameter groups: weight decay for the model's decayed parameters (or all,
// with [optimizer] decay_norms_and_biases), none for the rest.
std::vector<ParamGroup> parameter_groups(const nn::Model& model, const Config& optimizer);

}  // namespace strata::engine
