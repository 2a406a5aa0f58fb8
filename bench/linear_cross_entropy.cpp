// Time and memory of the output projection + cross entropy, forward and backward, on the CPU:
// the chunked kernel of linear_cross_entropy.chunked_cpu (kernels/cpu/linear_cross_entropy.cpp)
// against the unfused composition, at::linear then at::cross_entropy_loss in fp32 through
// autograd (what PyTorch eager runs for `F.cross_entropy(F.linear(h, w, b), t)`, and core's
// reference), and that composition with the loss by cross_entropy.fused_cpu
// (kernels/cpu/cross_entropy.cpp, what Strata runs without the fused_loss pass). Interleaved rounds, medians; peak bytes of tensors one forward+backward allocates
// beyond those live before it (core/include/strata/core/counting_cpu_allocator.h), beside the formulas. Prints a Markdown
// report; bench/results/linear_cross_entropy_cpu.md holds one, with its command.
//
// usage: strata_bench_linear_cross_entropy TOKENS DIM VOCAB ROUNDS THREADS [ROWS,ROWS,...]
//        (ROWS: also the kernel with these chunk sizes, to choose the default's)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/cross_entropy.h"
#include "cpu/linear_cross_entropy.h"
#include "strata/core/counting_cpu_allocator.h"
#include "cpu_timing.h"

using strata::bench::median;

namespace {

double mib(double bytes) { return bytes / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: strata_bench_linear_cross_entropy TOKENS DIM VOCAB ROUNDS THREADS [ROWS,ROWS,...]\n");
    return 2;
  }
  const int64_t n = std::stoll(argv[1]), d = std::stoll(argv[2]), v = std::stoll(argv[3]);
  const int rounds = std::stoi(argv[4]), threads = std::stoi(argv[5]);
  at::set_num_threads(threads);
  at::manual_seed(0);
  strata::CountingCpuAllocator& memory = strata::CountingCpuAllocator::install();
  const at::Tensor hidden = at::randn({n, d}).requires_grad_(true);
  const at::Tensor weight = (at::randn({v, d}) * 0.02).requires_grad_(true);
  const at::Tensor bias = at::zeros({v}).requires_grad_(true);
  const at::Tensor targets = at::randint(v, {n}, at::kLong);

  struct Impl {
    std::string name;
    std::function<at::Tensor()> loss;
    std::vector<double> ms;
    int64_t peak = 0;
    double value = 0;
  };
  std::vector<Impl> impls{
      {"unfused (at::linear + cross_entropy, autograd)",
       [&] { return at::cross_entropy_loss(at::linear(hidden, weight, bias), targets); }},
      {"chunked kernel (linear_cross_entropy.chunked_cpu)",
       [&] { return strata::kernels::linear_cross_entropy_chunked_cpu(hidden, weight, bias, targets); }},
      {"unfused with the fused loss (at::linear + cross_entropy.fused_cpu)",
       [&] { return strata::kernels::cross_entropy_fused_cpu(at::linear(hidden, weight, bias), targets); }},
  };
  if (argc == 7)
    for (std::string rest = argv[6]; !rest.empty();) {
      const size_t comma = rest.find(',');
      const int64_t rows = std::stoll(rest.substr(0, comma));
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      impls.push_back({"chunked kernel, " + std::to_string(rows) + " rows per chunk", [&, rows] {
                         return strata::kernels::linear_cross_entropy_chunked(hidden, weight, bias, targets, rows);
                       }});
    }
  auto step = [&](Impl& impl) {
    const at::Tensor loss = impl.loss();
    torch::autograd::grad({loss}, {hidden, weight, bias});
    impl.value = loss.item<double>();
  };
  for (auto& impl : impls) {
    step(impl);  // warm-up
    const int64_t before = memory.current();
    memory.reset_peak();
    step(impl);
    impl.peak = memory.peak() - before;
  }
  for (int r = 0; r < rounds; ++r)
    for (auto& impl : impls) {
      const auto start = std::chrono::steady_clock::now();
      step(impl);
      impl.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }

  const double logits = 4.0 * n * v, grads = 4.0 * (n * d + v * d + v);
  const int64_t chunk = strata::kernels::linear_cross_entropy_chunk_rows(v);
  std::printf("# Output projection + cross entropy on CPU (fp32, %d threads)\n\n", threads);
  std::printf("Command: `build/bin/strata_bench_linear_cross_entropy %lld %lld %lld %d %d%s%s`\n\n", static_cast<long long>(n),
              static_cast<long long>(d), static_cast<long long>(v), rounds, threads, argc == 7 ? " " : "", argc == 7 ? argv[6] : "");
  std::printf("Tokens N = %lld, width D = %lld, vocabulary V = %lld; forward and backward (gradients of hidden, weight and\n"
              "bias), %d interleaved rounds, median ms. Peak: the tensors one forward+backward allocates beyond those\n"
              "live before it (inputs excluded), measured by a counting CPU allocator.\n\n",
              static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(v), rounds);
  std::printf("| implementation | fwd+bwd ms | vs chunked | peak MiB | vs unfused | loss |\n|---|---|---|---|---|---|\n");
  for (const auto& impl : impls)
    std::printf("| %s | %.1f | %.2fx | %.1f | %.2fx | %.6f |\n", impl.name.c_str(), median(impl.ms), median(impl.ms) / median(impls[1].ms),
                mib(impl.peak), static_cast<double>(impl.peak) / impls[0].peak, impl.value);
  std::printf("\nFormulas (fp32): the [N, V] logits are %.1f MiB; unfused autograd holds the logits, their\n"
              "log-softmax (saved for backward) and the logits' gradient, about 3 x %.1f = %.1f MiB, plus the\n"
              "gradients of hidden, weight and bias, %.1f MiB. The chunked kernel holds the gradients (computed in the\n"
              "forward) and two chunk buffers of %lld rows x V (%.1f MiB each): %.1f MiB.\n",
              mib(logits), mib(logits), mib(3 * logits), mib(grads), static_cast<long long>(chunk), mib(4.0 * chunk * v),
              mib(grads + 2 * 4.0 * chunk * v));
  return 0;
}
