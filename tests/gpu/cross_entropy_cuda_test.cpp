// cross_entropy.fused_cuda (kernels/cuda/cross_entropy_kernels.cu) on a GPU against core's
// cross_entropy.reference on the same GPU and the fp64 formula: vocabularies below, at and above
// a block's 256 threads (1, 7, 100, 256, 4099, 50257), more rows than one block, ignored (-100)
// rows; bfloat16 and half logits; fp16 loss scaling (g = 65536) on half logits; no counted row;
// evaluation without gradients; a target out of range (NaN, the kernel cannot raise); the chunk
// loss of the chunked linear + cross-entropy on rows padded to a multiple of 64 with NaN in the
// padding (the wide kernel: 16-byte accesses), float and bf16, GPT-2's 50257 in 50304 among them.
// Skips without a CUDA device (or a build without nvcc).
#include <array>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/cross_entropy.h"
#include "cuda/cross_entropy_cuda.h"
#include "../cross_entropy_cases.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

using testing::scaled_error;

using testing::exact_cross_entropy;
using testing::loss_and_grad;
using testing::LossAndGrad;

at::Tensor fused(const at::Tensor& logits, const at::Tensor& targets) { return kernels::cross_entropy_fused_cuda(logits, targets); }
// The reference on fp32 logits (gradients flow back through the cast: rounded once to the dtype).
at::Tensor reference(const at::Tensor& logits, const at::Tensor& targets) {
  return kernels::cross_entropy_reference_call(logits.to(at::kFloat), targets);
}
at::Tensor targets_for(int64_t rows, int64_t vocab) { return testing::targets_for(rows, vocab, at::kCUDA); }

TEST(CrossEntropyCuda, MatchesTheReferenceAndTheFormula) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(0);
  for (const auto& [rows, vocab] :
       std::vector<std::array<int64_t, 2>>{{1, 1}, {3, 7}, {33, 100}, {300, 33}, {5, 256}, {64, 4099}, {9, 50257}}) {
    const at::Tensor logits = (at::randn({rows, vocab}) * 3).cuda(), targets = targets_for(rows, vocab);
    const LossAndGrad ours = loss_and_grad(fused, logits, targets), ref = loss_and_grad(reference, logits, targets);
    const LossAndGrad formula = loss_and_grad(exact_cross_entropy, logits.to(at::kDouble), targets);
    EXPECT_EQ(ours.loss.scalar_type(), at::kFloat);
    EXPECT_EQ(ours.loss.dim(), 0);
    EXPECT_TRUE(ours.loss.is_cuda());
    EXPECT_LE(scaled_error(ours.loss, formula.loss), 1e-6) << rows << " x " << vocab;
    EXPECT_LE(scaled_error(ours.grad, formula.grad), 1e-6) << rows << " x " << vocab;
    EXPECT_LE(scaled_error(ours.grad, ref.grad), 1e-6) << rows << " x " << vocab;
  }
}

TEST(CrossEntropyCuda, LowPrecisionLogitsRoundTheGradientOnce) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(1);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor logits = (at::randn({70, 1001}) * 2).to(dtype).cuda(), targets = targets_for(70, 1001);
    const LossAndGrad ours = loss_and_grad(fused, logits, targets), ref = loss_and_grad(reference, logits, targets);
    EXPECT_EQ(ours.grad.scalar_type(), dtype);
    EXPECT_LE(scaled_error(ours.loss, ref.loss), 1e-6) << c10::toString(dtype);
    EXPECT_LE(scaled_error(ours.grad, ref.grad), dtype == at::kBFloat16 ? 8e-3 : 1e-3) << c10::toString(dtype);
  }
}

TEST(CrossEntropyCuda, HalfLogitsUnderLossScalingRoundOnceAfterScaling) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  testing::expect_half_loss_scaling_rounds_once(fused, reference, at::kCUDA);
}

TEST(CrossEntropyCuda, NoCountedRowEvaluationAndABadTarget) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(3);
  const at::Tensor logits = at::randn({6, 10}).cuda();
  const at::Tensor ignored = at::full({6}, -100, at::kLong).cuda();
  const LossAndGrad ours = loss_and_grad(fused, logits, ignored), ref = loss_and_grad(reference, logits, ignored);
  EXPECT_TRUE(std::isnan(ours.loss.item<float>()) && std::isnan(ref.loss.item<float>()));
  EXPECT_TRUE(at::equal(ours.grad, at::zeros_like(ours.grad)));
  const at::Tensor targets = targets_for(6, 10);
  {
    at::NoGradGuard no_grad;
    EXPECT_LE(scaled_error(fused(logits, targets), reference(logits, targets)), 1e-6);
  }
  at::Tensor bad = targets.clone();
  bad[1] = 10;
  EXPECT_TRUE(std::isnan(fused(logits, bad).item<float>()));
}

TEST(CrossEntropyCuda, PaddedChunkRowsLeaveThePaddingOut) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(5);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (const auto& [rows, vocab, ld] : std::vector<std::array<int64_t, 3>>{{37, 101, 128}, {5, 4096, 4096}, {1170, 50257, 50304}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(rows) + " x " + std::to_string(vocab) + " in " +
                   std::to_string(ld));
      at::Tensor logits = (at::randn({rows, ld}) * 3).to(dtype).cuda();
      if (ld > vocab) logits.narrow(1, vocab, ld - vocab).fill_(NAN);  // the kernel must not use them
      at::Tensor targets = targets_for(rows, vocab);
      targets[1] = 0;
      targets[rows - 1] = vocab - 1;
      const at::Tensor loss_sum = at::zeros({}, logits.options().dtype(at::kDouble));
      const at::Tensor grad = at::empty({rows, ld}, logits.options());
      kernels::cross_entropy_chunk_loss_cuda(logits, vocab, targets, loss_sum, grad);
      // The fp64 formula on the real columns: per counted row lse - z_t, and softmax - onehot.
      const at::Tensor z = logits.narrow(1, 0, vocab).to(at::kDouble), counted = targets.ne(-100);
      const at::Tensor safe = targets.clamp_min(0), lse = z.logsumexp(1);
      const at::Tensor expected_sum = ((lse - z.gather(1, safe.unsqueeze(1)).squeeze(1)) * counted).sum();
      at::Tensor expected_grad = (z - lse.unsqueeze(1)).exp();
      expected_grad.scatter_add_(1, safe.unsqueeze(1), -at::ones({rows, 1}, expected_grad.options()));
      expected_grad.mul_(counted.unsqueeze(1));
      EXPECT_LE(scaled_error(loss_sum, expected_sum), 1e-6);
      EXPECT_LE(scaled_error(grad.narrow(1, 0, vocab), expected_grad), dtype == at::kBFloat16 ? 8e-3 : 1e-6);
      if (ld > vocab) EXPECT_TRUE(at::equal(grad.narrow(1, vocab, ld - vocab), at::zeros({rows, ld - vocab}, grad.options())));
    }
}

#else
TEST(CrossEntropyCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
