// The chunked linear + cross-entropy kernel (kernels/cpu/linear_cross_entropy.cpp) against core's
// linear_cross_entropy.reference (the logits written out): the loss and the gradients of hidden,
// weight and bias, with chunks that do and do not divide the rows, targets at the vocabulary's
// ends, fp64/fp32/bf16, a scaled incoming gradient (amp's loss scale), calls without gradients,
// and the table selecting the kernel through the kernels plugin.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/linear_cross_entropy.h"
#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"

namespace strata {
namespace {

at::Tensor reference(const at::Tensor& h, const at::Tensor& w, const std::optional<at::Tensor>& b, const at::Tensor& t) {
  const auto& impls = OperatorTable::global().implementations("linear_cross_entropy");
  const auto& ref = static_cast<const ops::OperatorImpl<ops::LinearCrossEntropy>&>(*impls.back());
  EXPECT_EQ(ref.name(), "linear_cross_entropy.reference");
  return ref.fn()(h, w, b, t);
}

double max_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs().max() / std::max(1.0, y.abs().max().item<double>())).item<double>();
}

struct Grads {
  at::Tensor loss, hidden, weight, bias;
};

// loss * scale backward, so the incoming gradient is not 1.
template <class Fn>
Grads run(Fn fn, const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& t, double scale) {
  at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  std::optional<at::Tensor> b;
  if (b0.defined()) b = b0.clone().requires_grad_(true);
  at::Tensor loss = fn(h, w, b, t);
  (loss * scale).backward();
  return {loss.detach(), h.grad(), w.grad(), b ? b->grad() : at::Tensor()};
}

void check(at::ScalarType dtype, int64_t rows, int64_t dim, int64_t vocab, bool bias, int64_t chunk, double tol,
           int64_t vocab_multiple = 1, kernels::ChunkLoss chunk_loss = nullptr) {
  at::manual_seed(rows * 131 + vocab);
  const auto opts = at::TensorOptions().dtype(dtype);
  const at::Tensor h = at::randn({rows, dim}, opts), w = at::randn({vocab, dim}, opts) * 0.3;
  const at::Tensor b = bias ? at::randn({vocab}, opts) : at::Tensor();
  at::Tensor t = at::randint(vocab, {rows}, at::kLong);
  t[0] = 0;
  t[rows - 1] = vocab - 1;  // the first and the last class
  // core's reference computes the loss in fp32 whatever the input; in fp64 the formula itself,
  // in fp64, is the reference, so chunk edges are checked to 1e-12.
  auto in_double = [](const at::Tensor& h_, const at::Tensor& w_, const std::optional<at::Tensor>& b_, const at::Tensor& t_) {
    return at::cross_entropy_loss(at::linear(h_, w_, b_), t_);
  };
  const Grads ref = dtype == at::kDouble ? run(in_double, h, w, b, t, 3.0) : run(reference, h, w, b, t, 3.0);
  const Grads ours = run(
      [&](const at::Tensor& h_, const at::Tensor& w_, const std::optional<at::Tensor>& b_, const at::Tensor& t_) {
        return kernels::linear_cross_entropy_chunked(h_, w_, b_, t_, chunk, /*input_dtype_gemms=*/false, vocab_multiple, chunk_loss);
      },
      h, w, b, t, 3.0);
  const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " chunk " + std::to_string(chunk) +
                           " vocab multiple " + std::to_string(vocab_multiple);
  EXPECT_EQ(ours.loss.scalar_type(), at::kFloat) << what;  // as the reference's, also for fp64 inputs
  EXPECT_EQ(ours.loss.dim(), 0) << what;
  // the loss is fp32 (about 7 digits) whatever the input
  EXPECT_LE(max_error(ours.loss, ref.loss), std::max(tol, 1e-6)) << what << ": loss " << ours.loss.item<double>() << " vs " << ref.loss.item<double>();
  EXPECT_EQ(ours.hidden.scalar_type(), dtype) << what;
  EXPECT_EQ(ours.weight.scalar_type(), dtype) << what;
  EXPECT_LE(max_error(ours.hidden, ref.hidden), tol) << what << ": grad hidden";
  EXPECT_LE(max_error(ours.weight, ref.weight), tol) << what << ": grad weight";
  if (bias) EXPECT_LE(max_error(ours.bias, ref.bias), tol) << what << ": grad bias";
}

TEST(LinearCrossEntropy, MatchesTheReferenceInDouble) {
  for (int64_t chunk : {1, 7, 16, 64, 1000})
    for (bool bias : {false, true}) check(at::kDouble, 64, 24, 50, bias, chunk, 1e-12);
}

TEST(LinearCrossEntropy, MatchesTheReferenceInFloat) {
  for (int64_t chunk : {5, 32, 256}) check(at::kFloat, 200, 32, 300, true, chunk, 2e-6);
  check(at::kFloat, 37, 16, 1000, false, kernels::linear_cross_entropy_chunk_rows(1000), 2e-6);
}

// The GEMMs over a vocabulary padded to a multiple (what chunked_cuda does for tensor-core
// alignment): zero weight rows, -inf logits, so the loss and the gradients are the formula's.
TEST(LinearCrossEntropy, APaddedVocabularyChangesNothing) {
  for (int64_t multiple : {7, 64})
    for (bool bias : {false, true}) check(at::kDouble, 64, 24, 50, bias, 16, 1e-12, multiple);
  check(at::kFloat, 200, 32, 300, true, 32, 2e-6, 64);
}

// A ChunkLoss as the CUDA kernel's contract says (cuda/cross_entropy_kernels.h), in ATen: the
// padding columns hold whatever the GEMM left (here poisoned with NaN first), must not be read,
// and get 0 in the gradient.
void chunk_loss_in_aten(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets, const at::Tensor& loss_sum,
                        const at::Tensor& grad) {
  const at::Tensor z = logits.narrow(1, 0, vocab);
  const at::Tensor lse = z.logsumexp(1);
  loss_sum.add_((lse - z.gather(1, targets.unsqueeze(1)).squeeze(1)).sum().to(at::kDouble));
  if (!grad.defined()) return;
  if (logits.size(1) > vocab) logits.narrow(1, vocab, logits.size(1) - vocab).fill_(NAN);
  grad.zero_();
  grad.narrow(1, 0, vocab).copy_((z - lse.unsqueeze(1)).exp().scatter_add(1, targets.unsqueeze(1), at::full({z.size(0), 1}, -1.0, z.options())));
}

// The chunk loop with a fused chunk loss (what chunked_cuda passes: the CUDA kernel) gives the
// formula's loss and gradients, padded vocabulary and bias included; fp64 inputs keep ATen's path.
TEST(LinearCrossEntropy, AChunkLossKernelServesTheChunks) {
  for (bool bias : {false, true}) check(at::kFloat, 200, 32, 300, bias, 32, 2e-6, 64, &chunk_loss_in_aten);
  check(at::kFloat, 37, 16, 1000, true, 37, 2e-6, 1, &chunk_loss_in_aten);
  check(at::kDouble, 64, 24, 50, true, 16, 1e-12, 64, &chunk_loss_in_aten);
}

// bf16 inputs: the kernel computes in fp32 from the bf16 values; the reference multiplies in bf16
// and rounds the logits to bf16 first, so they agree to bf16's precision.
TEST(LinearCrossEntropy, MatchesTheReferenceInBFloat16) { check(at::kBFloat16, 96, 32, 128, true, 40, 3e-2); }

TEST(LinearCrossEntropy, WithoutGradientsOnlyTheLoss) {
  const at::Tensor h = at::randn({33, 8}), w = at::randn({20, 8});
  const at::Tensor t = at::randint(20, {33}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor loss = kernels::linear_cross_entropy_chunked(h, w, std::nullopt, t, 10);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_LE(max_error(loss, reference(h, w, std::nullopt, t)), 1e-6);
}

TEST(LinearCrossEntropy, ChunkRowsFollowTheVocabulary) {
  EXPECT_EQ(kernels::linear_cross_entropy_chunk_rows(256), (int64_t{4} << 20) / (4 * 256));
  EXPECT_EQ(kernels::linear_cross_entropy_chunk_rows(4096), 256);   // 4 MiB / (4 bytes x 4096)
  EXPECT_EQ(kernels::linear_cross_entropy_chunk_rows(50257), 256);  // the floor (20 rows would fit 4 MiB)
  EXPECT_EQ(kernels::linear_cross_entropy_chunk_rows(int64_t{1} << 24), 256);
}

TEST(LinearCrossEntropy, TheKernelsPluginServesTheOperator) {
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  const at::Tensor h = at::randn({10, 8}), w = at::randn({12, 8});
  EXPECT_EQ(ops::select("linear_cross_entropy", h).name(), "linear_cross_entropy.chunked_cpu");
  const at::Tensor t = at::randint(12, {10}, at::kLong);
  EXPECT_LE(max_error(ops::linear_cross_entropy(h, w, std::nullopt, t), reference(h, w, std::nullopt, t)), 1e-6);
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
