// Time of one AdamW update over a model's worth of fp32 parameters: core's adamw_update.reference
// (torch.optim.AdamW's arithmetic, one ATen call per line) against adamw_update.fused_cpu
// (kernels/cpu/adamw.cpp, one pass). Tensors of the GPT-2 shapes of bench/step_time.py's sizes;
// interleaved rounds, medians; bytes moved by the fused pass (4 reads, 3 writes of 4 bytes per
// parameter) beside its time. Prints a Markdown table; bench/results/adamw_update_cpu.md holds one.
//
// usage: strata_bench_adamw_update ROUNDS THREADS N_LAYER:D_MODEL:VOCAB[,...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu/adamw.h"
#include "strata/core/operator_table.h"
#include "cpu_timing.h"

using strata::bench::median;

namespace {

struct Param {
  at::Tensor p, g, m, v;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: strata_bench_adamw_update ROUNDS THREADS N_LAYER:D_MODEL:VOCAB[,...]\n");
    return 2;
  }
  const int rounds = std::stoi(argv[1]), threads = std::stoi(argv[2]);
  at::set_num_threads(threads);
  const auto& impls = strata::OperatorTable::global().implementations("adamw_update");
  const auto& reference = static_cast<const strata::ops::OperatorImpl<strata::ops::AdamwUpdate>&>(*impls.back()).fn();
  std::printf("| model | parameters | reference ms | fused ms | reference / fused | fused GB/s |\n|---|---|---|---|---|---|\n");
  std::string specs = argv[3];
  for (size_t at_ = 0; at_ < specs.size();) {
    const size_t comma = std::min(specs.find(',', at_), specs.size());
    const std::string spec = specs.substr(at_, comma - at_);
    at_ = comma + 1;
    int64_t layers = 0, d = 0, vocab = 0;
    std::sscanf(spec.c_str(), "%ld:%ld:%ld", &layers, &d, &vocab);
    std::vector<std::vector<int64_t>> shapes{{vocab, d}};
    for (int64_t l = 0; l < layers; ++l)
      for (auto s : std::vector<std::vector<int64_t>>{{3 * d, d}, {3 * d}, {d, d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}, {d}, {d}, {d}, {d}})
        shapes.push_back(s);
    std::vector<Param> params;
    int64_t count = 0;
    for (const auto& s : shapes) {
      params.push_back({at::randn(s), at::randn(s), at::zeros(s), at::zeros(s)});
      count += params.back().p.numel();
    }
    strata::ops::AdamwHyper h{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
    auto time_one = [&](bool fused) {
      const auto start = std::chrono::steady_clock::now();
      for (auto& q : params)
        fused ? strata::kernels::adamw_update_fused_cpu(q.p, q.g, q.m, q.v, h) : reference(q.p, q.g, q.m, q.v, h);
      ++h.step;
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    time_one(false), time_one(true);  // warm-up
    std::vector<double> ref, fused;
    for (int r = 0; r < rounds; ++r) ref.push_back(time_one(false)), fused.push_back(time_one(true));
    const double bytes = 28.0 * static_cast<double>(count);
    std::printf("| %s | %.2f M | %.2f | %.2f | %.2f | %.1f |\n", spec.c_str(), count / 1e6, median(ref), median(fused),
                median(ref) / median(fused), bytes / (median(fused) * 1e6));
  }
  return 0;
}
