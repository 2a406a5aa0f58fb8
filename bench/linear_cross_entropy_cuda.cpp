// Peak memory and time of the output projection + cross-entropy on a GPU, forward and backward:
// linear_cross_entropy.chunked_cuda (kernels/cuda/linear_cross_entropy_cuda.cpp) and at::linear
// followed by cross_entropy.fused_cuda (kernels/cuda/cross_entropy_cuda.cpp) against core's
// reference (the [N, V] logits written out), GPT-2's vocabulary 50257 and d_model 768, 8 x 1024
// tokens, fp32 and bf16; then the loss alone on the [N, V] logits. Rounds interleaved, median of the rounds; peak above the inputs
// (bench/cuda_timing.h). Writes a markdown table to stdout (scripts/gpu_check saves it).
//
// usage: strata_bench_linear_cross_entropy_cuda [ROUNDS]
#include <algorithm>
#include <cstdio>
#include <vector>

#include <ATen/ATen.h>

#include "cuda/cross_entropy_cuda.h"
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
  // The reference's projection with the fused loss (cross_entropy.fused_cuda): the logits exist, their
  // log-probabilities and zero-filled gradient do not.
  const Fn linear_then_fused_loss = [](const at::Tensor& h, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                       const at::Tensor& t) { return kernels::cross_entropy_fused_cuda(at::linear(h, w, b), t); };
  const std::vector<std::pair<const char*, Fn>> impls{{"chunked_cuda", &kernels::linear_cross_entropy_chunked_cuda},
                                                      {"linear + cross_entropy.fused_cuda", linear_then_fused_loss},
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
  // The loss alone on given [N, V] logits: cross_entropy.fused_cuda against core's cross_entropy.reference.
  const auto& loss_reference =
      static_cast<const ops::OperatorImpl<ops::CrossEntropy>&>(*OperatorTable::global().implementations("cross_entropy").back());
  using LossFn = std::function<ops::CrossEntropy::Fn>;
  const std::vector<std::pair<const char*, LossFn>> losses{{"cross_entropy.fused_cuda", &kernels::cross_entropy_fused_cuda},
                                                           {"cross_entropy.reference", loss_reference.fn()}};
  std::printf("\nThe loss alone on [%lld, %lld] logits:\n\n", static_cast<long long>(rows), static_cast<long long>(vocab));
  std::printf("| dtype | implementation | fwd+bwd ms (median of %d) | peak MiB above inputs | memory vs reference | time vs reference |\n", rounds);
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    at::manual_seed(0);
    const at::Tensor z = (at::randn({rows, vocab}, opts) * 2).requires_grad_(true);
    const at::Tensor t = at::randint(vocab, {rows}, opts.dtype(at::kLong));
    std::vector<std::vector<double>> ms(losses.size()), peak(losses.size());
    for (int r = -1; r < rounds; ++r)
      for (size_t i = 0; i < losses.size(); ++i) {
        const bench::CudaSample s = bench::time_on_gpu([&] {
          z.mutable_grad() = at::Tensor();
          losses[i].second(z, t).backward();
        });
        if (r >= 0) ms[i].push_back(s.ms), peak[i].push_back(s.peak_mib);
      }
    using bench::median;
    const double ref_ms = median(ms.back()), ref_peak = median(peak.back());
    for (size_t i = 0; i < losses.size(); ++i)
      std::printf("| %s | %s | %.3f | %.0f | %.2fx | %.2fx |\n", c10::toString(dtype), losses[i].first, median(ms[i]),
                  median(peak[i]), median(peak[i]) / ref_peak, median(ms[i]) / ref_ms);
    std::fflush(stdout);
  }
  return 0;
}
