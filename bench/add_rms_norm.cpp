// Time of add_rms_norm.fused_cpu (kernels/cpu/rms_norm.cpp) against the unfused residual step it
// replaces: ATen's add, then rms_norm.fused_cpu, the sum's two gradients added by autograd.
// Forward + backward through autograd as a Llama block runs them ({sum, norm(sum)} both used), on
// [ROWS, COLS] activations: fp32; an fp32 residual with a bf16 branch (autocast's). (16-bit sums
// go to the reference: the results file keeps the run that showed the kernel slower there.)
// Interleaved rounds, medians. Prints a Markdown table; bench/results/add_rms_norm_cpu.md holds
// one, with its command.
//
// usage: strata_bench_add_rms_norm ROUNDS THREADS ROWSxCOLS[,ROWSxCOLS...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "cpu/rms_norm.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "cpu_timing.h"

using strata::bench::median;
using strata::bench::ms_of;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: strata_bench_add_rms_norm ROUNDS THREADS ROWSxCOLS[,ROWSxCOLS...]\n");
    return 2;
  }
  // The fused kernels serve only where rms_norm.fused_cpu serves the norm: install the plugin's table.
  strata::ComponentRegistry registry;
  strata::PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  strata::OperatorTable::global().install(registry);
  const int rounds = std::stoi(argv[1]), threads = std::stoi(argv[2]);
  at::set_num_threads(threads);
  std::printf("| residual | branch | shape | add + rms_norm.fused_cpu ms | add_rms_norm.fused_cpu ms | unfused / fused |\n"
              "|---|---|---|---|---|---|\n");
  std::string shapes = argv[3];
  for (size_t at_ = 0; at_ < shapes.size();) {
    const size_t comma = std::min(shapes.find(',', at_), shapes.size());
    const std::string shape = shapes.substr(at_, comma - at_);
    at_ = comma + 1;
    const int64_t rows = std::stoll(shape.substr(0, shape.find('x'))), cols = std::stoll(shape.substr(shape.find('x') + 1));
    for (const auto& [residual_type, branch_type] : {std::pair{at::kFloat, at::kFloat}, std::pair{at::kFloat, at::kBFloat16}}) {
      at::manual_seed(0);
      const at::Tensor r = at::randn({rows, cols}).to(residual_type).requires_grad_(true);
      const at::Tensor x = at::randn({rows, cols}).to(branch_type).requires_grad_(true);
      const at::Tensor w = (at::rand({cols}) + 0.5).requires_grad_(true);
      const at::Tensor d_sum = at::randn({rows, cols}).to(residual_type), d_y = at::randn({rows, cols});
      auto step = [&](bool fused) {
        strata::ops::AddNormResult out;
        if (fused) {
          out = strata::kernels::add_rms_norm_fused_cpu(r, x, w, 1e-5);
          if (out.sum.grad_fn()->name().find("AddRmsNormFunction") == std::string::npos) {
            std::fprintf(stderr, "add_rms_norm.fused_cpu did not take the call\n");
            std::exit(1);
          }
        } else {
          out.sum = r + x;
          out.normed = strata::kernels::rms_norm_fused_cpu(out.sum, w, 1e-5);
        }
        torch::autograd::grad({out.sum, out.normed}, {r, x, w}, {d_sum, d_y.to(out.normed.scalar_type())});
      };
      std::vector<double> unfused, fused;
      step(false), step(true);  // warm-up
      for (int round = 0; round < rounds; ++round) {
        unfused.push_back(ms_of([&] { step(false); }));
        fused.push_back(ms_of([&] { step(true); }));
      }
      std::printf("| %s | %s | %lldx%lld | %.3f | %.3f | %.2f |\n", c10::toString(residual_type), c10::toString(branch_type),
                  static_cast<long long>(rows), static_cast<long long>(cols), median(unfused), median(fused),
                  median(unfused) / median(fused));
    }
  }
  return 0;
}
