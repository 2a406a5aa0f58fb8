// Peak memory and time of the output projection + cross-entropy on a GPU, forward and backward:
// linear_cross_entropy.chunked_cuda (kernels/cuda/linear_cross_entropy_cuda.cpp) against core's
// reference (the [N, V] logits written out), GPT-2's vocabulary 50257 and d_model 768, 8 x 1024
// tokens, fp32 and bf16. Rounds interleaved, median of the rounds; peak above the inputs
// (bench/cuda_timing.h). Writes a markdown table to stdout (scripts/gpu_check saves it).
//
// usage: strata_bench_linear_cross_entropy_cuda [ROUNDS]
#include <algorithm>
#include <cstdio>
#include <vector>

#include <ATen/ATen.h>

#include "cuda/linear_cross_entropy_cuda.h"
#include "cuda_timing.h"
#include "strata/core/operator_table.h"

int main(int argc, char** argv) {
  using namespace strata;
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "strata_bench_linear_cross_entropy_cuda: no CUDA device\n");
    return 2;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const auto& reference = static_cast<const ops::OperatorImpl<ops::LinearCrossEntropy>&>(
      *OperatorTable::global().implementations("linear_cross_entropy").back());
  using Fn = std::function<ops::LinearCrossEntropy::Fn>;
  const std::vector<std::pair<const char*, Fn>> impls{{"chunked_cuda", &kernels::linear_cross_entropy_chunked_cuda},
                                                      {"reference", reference.fn()}};
  const int64_t rows = 8 * 1024, dim = 768, vocab = 50257;
  std::printf("| dtype | implementation | fwd+bwd ms (median of %d) | peak MiB above inputs | memory vs reference | time vs reference |\n", rounds);
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    at::manual_seed(0);
    const at::Tensor h = at::randn({rows, dim}, opts).requires_grad_(true);
    const at::Tensor w = (at::randn({vocab, dim}, opts) * 0.02).requires_grad_(true);
    const at::Tensor t = at::randint(vocab, {rows}, opts.dtype(at::kLong));
    std::vector<std::vector<double>> ms(impls.size()), peak(impls.size());
    for (int r = -1; r < rounds; ++r)  // round -1 warms up
      for (size_t i = 0; i < impls.size(); ++i) {
        const bench::CudaSample s = bench::time_on_gpu([&] {
          h.mutable_grad() = at::Tensor();
          w.mutable_grad() = at::Tensor();
          impls[i].second(h, w, std::nullopt, t).backward();
        });
        if (r >= 0) ms[i].push_back(s.ms), peak[i].push_back(s.peak_mib);
      }
    using bench::median;
    const double ref_ms = median(ms.back()), ref_peak = median(peak.back());
    for (size_t i = 0; i < impls.size(); ++i)
      std::printf("| %s | %s | %.3f | %.0f | %.2fx | %.2fx |\n", c10::toString(dtype), impls[i].first, median(ms[i]), median(peak[i]),
                  median(peak[i]) / ref_peak, median(ms[i]) / ref_ms);
    std::fflush(stdout);
  }
  return 0;
}
