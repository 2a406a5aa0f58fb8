// A program that keeps a plain torch::nn::Module (tiny_net.h) and trains it through the library
// API with the strategy file named on the command line (`key=value` overrides after it): fsdp and
// amp in strategy.toml. Under `mpirun -n N` every rank runs this program. Rank 0 prints the last
// step's loss with 17 digits. With --sequential the network is the same layers as a
// torch::nn::Sequential (tiny_net.h), whose children Strata makes blocks: act_checkpoint can then
// name one (pass.act_checkpoint.blocks=["hidden"]) and fsdp shards each as a unit.
//
//   train_plain_module [--sequential] strategy.toml [section.key=value ...]
#include <cstdio>
#include <iostream>
#include <string>

#include "strata/accelerate.h"
#include "strata/core/launch_env.h"
#include "strata/errors.h"
#include "tiny_net.h"

constexpr int64_t kVocab = 32, kSeqLen = 8, kWidth = 16;

int main(int argc, char** argv) {
  const bool sequential = argc > 1 && std::string(argv[1]) == "--sequential";
  const int first = sequential ? 2 : 1;
  if (argc <= first) {
    std::cerr << "usage: train_plain_module [--sequential] STRATEGY [section.key=value ...]\n";
    return 2;
  }
  strata::Strategy strategy;
  try {
    strategy = strata::Strategy::from_file(argv[first]);
    for (int i = first + 1; i < argc; ++i) strategy.set(argv[i]);
  } catch (const strata::UserError& e) {  // an unreadable file: one line, once, exit status 2
    if (strata::detect_launch_env().rank == 0) std::cerr << "train_plain_module: " << e.what() << "\n";
    return 2;
  }
  auto model = sequential ? strata::plain_sequential(
                                "tiny_net", [] { return plain_module::tiny_sequential(kVocab, kWidth); }, kVocab, kSeqLen)
                          : strata::plain_module<plain_module::TinyNet>(
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
