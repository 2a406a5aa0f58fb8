// Time of the fused activations (kernels/cpu/activations.cpp: gelu.fused_cpu, swiglu.fused_cpu)
// against core's references (ATen's gelu "tanh"; silu(gate) * up), forward + backward through
// autograd as a model runs them, on [ROWS, COLS] activations. Interleaved rounds, medians.
// Prints a Markdown table; bench/results/activations_cpu.md holds one, with its command.
//
// usage: strata_bench_activations ROUNDS THREADS ROWSxCOLS[,ROWSxCOLS...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/activations.h"
#include "cpu_timing.h"

using strata::bench::median;
using strata::bench::ms_of;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: strata_bench_activations ROUNDS THREADS ROWSxCOLS[,ROWSxCOLS...]\n");
    return 2;
  }
  const int rounds = std::stoi(argv[1]), threads = std::stoi(argv[2]);
  at::set_num_threads(threads);
  std::printf("| op | dtype | shape | reference ms | fused ms | reference / fused |\n|---|---|---|---|---|---|\n");
  std::string shapes = argv[3];
  for (size_t at_ = 0; at_ < shapes.size();) {
    const size_t comma = std::min(shapes.find(',', at_), shapes.size());
    const std::string shape = shapes.substr(at_, comma - at_);
    at_ = comma + 1;
    const int64_t rows = std::stoll(shape.substr(0, shape.find('x'))), cols = std::stoll(shape.substr(shape.find('x') + 1));
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      at::manual_seed(0);
      const at::Tensor x = (at::randn({rows, cols}) * 2).to(dtype).requires_grad_(true);
      const at::Tensor u = at::randn({rows, cols}).to(dtype).requires_grad_(true), dy = at::randn({rows, cols}).to(dtype);
      auto gelu_step = [&](bool fused) {
        at::Tensor y = fused ? strata::kernels::gelu_tanh_fused_cpu(x) : at::gelu(x, "tanh");
        torch::autograd::grad({y}, {x}, {dy});
      };
      auto swiglu_step = [&](bool fused) {
        at::Tensor y = fused ? strata::kernels::swiglu_fused_cpu(x, u) : at::silu(x) * u;
        torch::autograd::grad({y}, {x, u}, {dy});
      };
      for (auto [name, step] : {std::pair<const char*, std::function<void(bool)>>{"gelu", gelu_step}, {"swiglu", swiglu_step}}) {
        std::vector<double> ref, fused;
        step(false), step(true);  // warm-up
        for (int r = 0; r < rounds; ++r) {
          ref.push_back(ms_of([&] { step(false); }));
          fused.push_back(ms_of([&] { step(true); }));
        }
        std::printf("| %s | %s | %lldx%lld | %.3f | %.3f | %.2f |\n", name, c10::toString(dtype), static_cast<long long>(rows),
                    static_cast<long long>(cols), median(ref), median(fused), median(ref) / median(fused));
      }
    }
  }
  return 0;
}
