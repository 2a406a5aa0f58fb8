// A program that keeps a plain torch::nn::Module (tiny_net.h) and trains it through the library
// API with the strategy file named on the command line (`key=value` overrides after it): fsdp and
// amp in strategy.toml. Under `mpirun -n N` every rank runs this program. Rank 0 prints the last
// step's loss with 17 digits.
//
//   train_plain_module strategy.toml [section.key=value ...]
#include <cstdio>
#include <iostream>

#include "strata/accelerate.h"
#include "strata/core/launch_env.h"
#include "tiny_net.h"

constexpr int64_t kVocab = 32, kSeqLen = 8, kWidth = 16;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: train_plain_module STRATEGY [section.key=value ...]\n";
    return 2;
  }
  strata::Strategy strategy = strata::Strategy::from_file(argv[1]);
  for (int i = 2; i < argc; ++i) strategy.set(argv[i]);
  auto model = strata::plain_module<plain_module::TinyNet>(
      "tiny_net", [] { return std::make_shared<plain_module::TinyNet>(kVocab, kWidth); }, kVocab, kSeqLen);
  strata::Accelerated result = strata::accelerate(std::move(model), {}, nullptr, {}, strategy);
  if (!result.ok) {
    if (strata::detect_launch_env().rank == 0) std::cerr << "train_plain_module: " << result.status << "\n";  // once, not per rank
    return 2;
  }
  const strata::RunSummary summary = result.trainer->run();
  if (result.trainer->job().topology->rank() == 0)
    std::printf("last step %lld loss %.17g\n", static_cast<long long>(summary.last_step), summary.last_loss);
  return 0;
}
