// Times one AGD optimizer step over the parameter tensors of a GPT-2 shaped model with each
// implementation of the agd_update operator (core's reference and the fused CPU loop) and with
// the AdamW plugin for scale. Prints one JSON object per line; bench/agd_update.py tabulates.
//
// usage: strata_bench_agd_update N_LAYER D_MODEL VOCAB SEQ_LEN STEPS THREADS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/optimizer.h"
#include "strata/testing.h"

namespace {

using namespace strata;

std::vector<std::vector<int64_t>> gpt_shapes(int64_t layers, int64_t d, int64_t vocab, int64_t seq_len) {
  std::vector<std::vector<int64_t>> shapes{{vocab, d}, {seq_len, d}, {d}, {d}};
  for (int64_t l = 0; l < layers; ++l)
    for (auto s : std::vector<std::vector<int64_t>>{{d}, {d}, {3 * d, d}, {3 * d}, {d, d}, {d}, {d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}})
      shapes.push_back(s);
  return shapes;
}

double median_step_ms(Optimizer& optimizer, int steps) {
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.step(1e-4);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: strata_bench_agd_update N_LAYER D_MODEL VOCAB SEQ_LEN STEPS THREADS\n");
    return 2;
  }
  const int64_t layers = std::stoll(argv[1]), d = std::stoll(argv[2]), vocab = std::stoll(argv[3]), seq = std::stoll(argv[4]);
  const int steps = std::stoi(argv[5]);
  at::set_num_threads(std::stoi(argv[6]));
  at::globalContext().setFlushDenormal(true);
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({installed_plugin_dir()});

  at::manual_seed(0);
  ParamGroup group;
  int64_t numel = 0;
  for (const auto& shape : gpt_shapes(layers, d, vocab, seq)) {
    at::Tensor p = at::randn(shape) * 0.02;
    p.mutable_grad() = at::randn(shape) * 1e-3;
    group.names.push_back("p" + std::to_string(group.names.size()));
    group.params.push_back(p);
    numel += p.numel();
  }
  group.weight_decay = 0.1;
  auto run = [&](const std::string& label, const std::string& optimizer_name, bool fused, std::map<std::string, Value> keys) {
    OperatorTable::global().reset();
    if (fused) OperatorTable::global().install(registry);
    const auto* factory = static_cast<const OptimizerFactory*>(registry.find(ComponentKind::Optimizer, optimizer_name));
    auto optimizer = factory->create({group}, testing::config_for(*factory, keys));
    median_step_ms(*optimizer, 3);  // warm up: first-touch of the state pages
    std::printf("{\"impl\": \"%s\", \"params\": %lld, \"tensors\": %zu, \"median_ms\": %.4f}\n", label.c_str(),
                static_cast<long long>(numel), group.params.size(), median_step_ms(*optimizer, steps));
  };
  run("agd reference (ATen ops)", "agd", false, {});
  run("agd fused", "agd", true, {});
  run("agd reference, amsgrad+win", "agd", false, {{"amsgrad", true}, {"win", true}});
  run("agd fused, amsgrad+win", "agd", true, {{"amsgrad", true}, {"win", true}});
  run("adamw plugin", "adamw", false, {});
  return 0;
}
