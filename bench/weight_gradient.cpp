// The weight gradient of a Linear layer, dW = dy^T x, on the CPU (fp32): MKL (at::mm on the
// transposed view, what PyTorch eager's autograd and at::linear's backward call) against oneDNN's
// matmul on the same views (kernels::linear_weight_gradient, what linear.onednn_cpu's backward
// calls). The bench GPTs' shapes, N = 2048 tokens; interleaved rounds, medians;
// GF/s = 2 N in out / time. Prints a Markdown table; bench/results/gemm_cpu.md holds one.
//
// usage: strata_bench_weight_gradient ROUNDS THREADS
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu/linear_onednn.h"
#include "cpu_timing.h"

using strata::bench::median;

namespace {

// Milliseconds of the fastest of three calls: one round's measure.
double best_of_three_ms(const std::function<void()>& call) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ROUNDS THREADS\n", argv[0]);
    return 2;
  }
  const int rounds = std::atoi(argv[1]);
  at::set_num_threads(std::atoi(argv[2]));
  const int64_t n = 2048;
  // in -> out of the small (384) and medium (512) GPTs' layers: qkv, attention out, MLP up and
  // down, LM head.
  const std::vector<std::array<int64_t, 2>> shapes{{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}, {384, 4096},
                                                   {512, 1536}, {512, 512},  {512, 2048}, {2048, 512}, {512, 4096}};
  std::printf("| in -> out | MKL ms | MKL GF/s | oneDNN matmul ms | oneDNN GF/s | oneDNN / MKL time | max rel. difference |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  double total_mkl = 0, total_onednn = 0;
  for (const auto& [in, out] : shapes) {
    const at::Tensor x = at::randn({n, in}), dy = at::randn({n, out});
    const at::Tensor by_mkl = dy.t().mm(x), by_onednn = strata::kernels::linear_weight_gradient(dy, x);
    const double difference = ((by_onednn - by_mkl).abs().max() / by_mkl.abs().max()).item<double>();
    std::vector<double> mkl, onednn;
    for (int r = 0; r < rounds; ++r) {
      mkl.push_back(best_of_three_ms([&] { dy.t().mm(x); }));
      onednn.push_back(best_of_three_ms([&] { strata::kernels::linear_weight_gradient(dy, x); }));
    }
    const double a = median(mkl), b = median(onednn), gflop = 2.0 * n * in * out / 1e6;
    total_mkl += a;
    total_onednn += b;
    std::printf("| %lld -> %lld | %.2f | %.0f | %.2f | %.0f | %.3f | %.1e |\n", static_cast<long long>(in),
                static_cast<long long>(out), a, gflop / a, b, gflop / b, b / a, difference);
  }
  std::printf("\nAll shapes: MKL %.1f ms, oneDNN matmul %.1f ms (%.3fx).\n", total_mkl, total_onednn, total_onednn / total_mkl);
  return 0;
}
