// Time and peak memory of RMSNorm on a GPU, forward and backward: rms_norm.fused_cuda
// (kernels/cuda/rms_norm_kernels.cu) against core's rms_norm.reference, at Llama-7B's width (4096)
// over 8 x 1024 tokens, fp32 and bf16 (weight of x's dtype). Rounds interleaved, median of the
// rounds; peak above the inputs (bench/cuda_timing.h). Writes a markdown table to stdout
// (scripts/gpu_check saves it).
//
// usage: strata_bench_rms_norm_cuda [ROUNDS]
#include <cstdio>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "cuda/rms_norm_cuda.h"
#include "cuda_timing.h"
#include "strata/core/operator_table.h"

int main(int argc, char** argv) {
  using namespace strata;
#ifndef STRATA_HAVE_CUDA_KERNELS
  std::fprintf(stderr, "strata_bench_rms_norm_cuda: built without nvcc\n");
  return 2;
#else
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "strata_bench_rms_norm_cuda: no CUDA device\n");
    return 2;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const auto& reference =
      static_cast<const ops::OperatorImpl<ops::RmsNorm>&>(*OperatorTable::global().implementations("rms_norm").back());
  using Fn = std::function<ops::RmsNorm::Fn>;
  const std::vector<std::pair<const char*, Fn>> impls{{"fused_cuda", &kernels::rms_norm_fused_cuda}, {"reference", reference.fn()}};
  const int64_t rows = 8 * 1024, dim = 4096;
  std::printf("| dtype | implementation | fwd+bwd ms (median of %d) | peak MiB above inputs | memory vs reference | time vs reference |\n", rounds);
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    at::manual_seed(0);
    const at::Tensor x = at::randn({rows, dim}, opts).requires_grad_(true), w = (at::rand({dim}, opts) + 0.5).requires_grad_(true);
    const at::Tensor dy = at::randn({rows, dim}, opts);
    std::vector<std::vector<double>> ms(impls.size()), peak(impls.size());
    for (int r = -1; r < rounds; ++r)  // round -1 warms up
      for (size_t i = 0; i < impls.size(); ++i) {
        const bench::CudaSample s = bench::time_on_gpu([&] {
          x.mutable_grad() = at::Tensor();
          w.mutable_grad() = at::Tensor();
          impls[i].second(x, w, 1e-6).backward(dy);
        });
        if (r >= 0) ms[i].push_back(s.ms), peak[i].push_back(s.peak_mib);
      }
    using bench::median;
    for (size_t i = 0; i < impls.size(); ++i)
      std::printf("| %s | %s | %.3f | %.0f | %.2fx | %.2fx |\n", c10::toString(dtype), impls[i].first, median(ms[i]), median(peak[i]),
                  median(peak[i]) / median(peak.back()), median(ms[i]) / median(ms.back()));
    std::fflush(stdout);
  }
  return 0;
#endif
}
