// Time and peak memory of the fused activations on a GPU, forward and backward:
// gelu.fused_cuda and swiglu.fused_cuda (kernels/cuda/activation_kernels.cu) against core's
// references (ATen's gelu "tanh"; silu(gate) * up through a temporary), at GPT-2's MLP width
// (8 x 1024 tokens x 3072) and Llama-7B's (8 x 1024 tokens x 11008), fp32 and bf16. Rounds
// interleaved, median of the rounds; peak above the inputs (bench/cuda_timing.h). Writes a
// markdown table to stdout (scripts/gpu_check saves it).
//
// usage: strata_bench_activations_cuda [ROUNDS]
#include <cstdio>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "cuda/activations_cuda.h"
#include "cuda_timing.h"

int main(int argc, char** argv) {
  using namespace strata;
#ifndef STRATA_HAVE_CUDA_KERNELS
  std::fprintf(stderr, "strata_bench_activations_cuda: built without nvcc\n");
  return 2;
#else
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "strata_bench_activations_cuda: no CUDA device\n");
    return 2;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  using Op = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
  struct Case {
    const char* op;
    int64_t width;
    std::vector<std::pair<const char*, Op>> impls;  // ours first, the reference last
  };
  const std::vector<Case> cases{
      {"gelu", 3072,
       {{"fused_cuda", [](const at::Tensor& x, const at::Tensor&) { return kernels::gelu_tanh_fused_cuda(x); }},
        {"reference", [](const at::Tensor& x, const at::Tensor&) { return at::gelu(x, "tanh"); }}}},
      {"swiglu", 11008,
       {{"fused_cuda", [](const at::Tensor& g, const at::Tensor& u) { return kernels::swiglu_fused_cuda(g, u); }},
        {"reference", [](const at::Tensor& g, const at::Tensor& u) { return at::silu(g) * u; }}}}};
  const int64_t tokens = 8 * 1024;
  std::printf("| op | shape | dtype | implementation | fwd+bwd ms (median of %d) | peak MiB above inputs | time vs reference |\n", rounds);
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases)
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      at::manual_seed(0);
      const at::Tensor a = at::randn({tokens, c.width}, opts).requires_grad_(true), b = at::randn({tokens, c.width}, opts).requires_grad_(true);
      const at::Tensor dy = at::randn({tokens, c.width}, opts);
      std::vector<std::vector<double>> ms(c.impls.size()), peak(c.impls.size());
      for (int r = -1; r < rounds; ++r)  // round -1 warms up
        for (size_t i = 0; i < c.impls.size(); ++i) {
          const bench::CudaSample s = bench::time_on_gpu([&] {
            a.mutable_grad() = at::Tensor();
            b.mutable_grad() = at::Tensor();
            c.impls[i].second(a, b).backward(dy);
          });
          if (r >= 0) ms[i].push_back(s.ms), peak[i].push_back(s.peak_mib);
        }
      using bench::median;
      for (size_t i = 0; i < c.impls.size(); ++i)
        std::printf("| %s | %ld x %ld | %s | %s | %.3f | %.0f | %.2fx |\n", c.op, static_cast<long>(tokens), static_cast<long>(c.width),
                    c10::toString(dtype), c.impls[i].first, median(ms[i]), median(peak[i]), median(ms[i]) / median(ms.back()));
      std::fflush(stdout);
    }
  return 0;
#endif
}
