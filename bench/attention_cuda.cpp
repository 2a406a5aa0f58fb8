// Times attention forward + backward on a GPU: attention.sdpa_cuda (kernels/cuda/attention_sdpa.cpp),
// its memory-efficient path alone, and core's attention.reference, bf16 and fp32, 16 query heads
// sharing 4 k/v heads (a Llama's GQA), for the masks a training step uses: causal, packed
// documents with causal, and both with the log-sum-exp (what context parallel's ring asks for). Rounds interleaved (each round runs every
// implementation once), median of the rounds; peak memory is the CUDA caching allocator's peak
// during one call above what was allocated before it. An implementation that runs out of memory
// is reported as such. Writes a markdown table to stdout (scripts/gpu_check saves it as
// bench/results/attention_cuda.md on a GPU day).
//
// usage: strata_bench_attention_cuda [ROUNDS]
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "cuda/attention_sdpa.h"
#include "cuda_timing.h"
#include "strata/core/operator_table.h"

namespace {

using namespace strata;
using Attention = std::function<ops::AttentionResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                     const ops::AttentionMask&, bool)>;

using bench::CudaSample;

CudaSample run_once(const Attention& attention, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const ops::AttentionMask& mask, bool with_lse) {
  return bench::time_on_gpu([&] {
    const ops::AttentionResult r = attention(q, k, v, mask, with_lse);
    at::Tensor loss = r.out.to(at::kFloat).sum();
    if (with_lse) loss = loss + at::where(r.lse.isinf(), at::zeros_like(r.lse), r.lse).sum();
    torch::autograd::grad({loss}, {q, k, v});
  });
}


}  // namespace

int main(int argc, char** argv) {
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "strata_bench_attention_cuda: no CUDA device\n");
    return 2;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const auto& reference = static_cast<const ops::OperatorImpl<ops::Attention>&>(*OperatorTable::global().implementations("attention").back());
  const std::vector<std::pair<std::string, Attention>> impls{{"sdpa_cuda", &kernels::attention_sdpa_cuda},
                                                              {"efficient path", &kernels::attention_efficient_cuda},
                                                              {"reference", reference.fn()}};
  const int64_t batch = 1, heads = 16, kv_heads = 4, dim = 128;
  std::printf("| dtype | mask | T | implementation | fwd+bwd ms (median of %d) | peak MiB above inputs | time vs reference |\n", rounds);
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const auto dtype : {at::kBFloat16, at::kFloat})
  for (const std::string kind : {"causal", "documents+causal", "causal+lse", "documents+causal+lse"})
    for (int64_t t : {1024, 4096, 16384}) {
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      at::manual_seed(0);
      const at::Tensor q = at::randn({batch, heads, t, dim}, opts).requires_grad_(true);
      const at::Tensor k = at::randn({batch, kv_heads, t, dim}, opts).requires_grad_(true);
      const at::Tensor v = at::randn({batch, kv_heads, t, dim}, opts).requires_grad_(true);
      ops::AttentionMask mask;
      mask.causal = true;
      if (kind.rfind("documents", 0) == 0)  // documents of 512 tokens, as packed text
        mask.q_document = mask.kv_document = at::arange(t, at::TensorOptions().device(at::kCUDA).dtype(at::kLong)).div(512, "floor").unsqueeze(0);
      const bool with_lse = kind.find("+lse") != std::string::npos;
      std::vector<std::vector<double>> ms(impls.size()), peak(impls.size());
      for (size_t i = 0; i < impls.size(); ++i) run_once(impls[i].second, q, k, v, mask, with_lse);  // warm-up
      for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < impls.size(); ++i) {
          const CudaSample s = run_once(impls[i].second, q, k, v, mask, with_lse);
          ms[i].push_back(s.ms), peak[i].push_back(s.peak_mib);
        }
      const double ref_ms = bench::median(ms.back());
      for (size_t i = 0; i < impls.size(); ++i) {
        const double m = bench::median(ms[i]);
        if (m < 0) {
          std::printf("| %s | %s | %ld | %s | out of memory | - | - |\n", c10::toString(dtype), kind.c_str(), static_cast<long>(t),
                      impls[i].first.c_str());
          continue;
        }
        std::printf("| %s | %s | %ld | %s | %.3f | %.0f | %s |\n", c10::toString(dtype), kind.c_str(), static_cast<long>(t),
                    impls[i].first.c_str(), m,
                    bench::median(peak[i]), ref_ms > 0 ? (std::to_string(m / ref_ms).substr(0, 5) + "x").c_str() : "-");
      }
      std::fflush(stdout);
    }
  return 0;
}
