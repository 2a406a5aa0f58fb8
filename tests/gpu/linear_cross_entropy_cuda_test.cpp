// linear_cross_entropy.chunked_cuda (kernels/cuda/linear_cross_entropy_cuda.cpp) on a GPU against
// core's linear_cross_entropy.reference on the same GPU: the loss and the gradients of hidden,
// weight and bias, with chunks that do and do not divide the rows (the GPU's own chunk size too)
// and vocabularies padded to 64 (101, 1000, 50257: the fused loss kernel's padding columns),
// targets at the vocabulary's ends, fp32 and bf16 (bf16 GEMMs into fp32, as chunked_cuda runs them),
// a scaled incoming gradient. Skips without a
// CUDA device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "cpu/linear_cross_entropy.h"
#include "cuda/linear_cross_entropy_cuda.h"
#include "strata/core/operator_table.h"
#include "autocast_scope.h"

namespace strata {
namespace {

struct Result {
  at::Tensor loss, hidden, weight, bias;
};

template <class Fn>
Result run(Fn fn, const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& t) {
  at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  std::optional<at::Tensor> b;
  if (b0.defined()) b = b0.clone().requires_grad_(true);
  at::Tensor loss = fn(h, w, b, t);
  (loss * 3.0).backward();  // an incoming gradient that is not 1, as amp's loss scale
  return {loss.detach(), h.grad(), w.grad(), b ? b->grad() : at::Tensor()};
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).abs().max().item<double>() / std::max(1.0, y.abs().max().item<double>());
}

TEST(LinearCrossEntropyCuda, MatchesTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  OperatorTable::global().reset();
  const auto& ref = static_cast<const ops::OperatorImpl<ops::LinearCrossEntropy>&>(
      *OperatorTable::global().implementations("linear_cross_entropy").back());
  ASSERT_EQ(ref.name(), "linear_cross_entropy.reference");
  for (const auto dtype : {at::kFloat, at::kBFloat16})
    for (const auto [rows, dim, vocab, chunk] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{37, 16, 101, 8},
                                                {64, 32, 1000, 64}, {3000, 64, 50257, 0}})
      for (bool bias : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " vocab " + std::to_string(vocab) +
                     (bias ? " bias" : "") + " chunk " + (chunk ? std::to_string(chunk) : "gpu default"));
        at::manual_seed(rows + vocab);
        const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
        const at::Tensor h = at::randn({rows, dim}, opts), w = at::randn({vocab, dim}, opts) * 0.3;
        const at::Tensor b = bias ? at::randn({vocab}, opts) : at::Tensor();
        at::Tensor t = at::randint(vocab, {rows}, opts.dtype(at::kLong));
        t[0] = 0;
        t[rows - 1] = vocab - 1;
        const Result expected = run(ref.fn(), h, w, b, t);
        const Result ours =
            chunk ? run([&](auto&&... a) { return kernels::linear_cross_entropy_chunked_cuda_rows(a..., chunk); }, h, w, b, t)
                  : run(kernels::linear_cross_entropy_chunked_cuda, h, w, b, t);
        // fp32: summation order; bf16: gradients rounded to 8 bits of mantissa at the end.
        const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
        EXPECT_LE(relative_error(ours.loss, expected.loss), tol) << "loss";
        EXPECT_LE(relative_error(ours.hidden, expected.hidden), tol) << "grad hidden";
        EXPECT_LE(relative_error(ours.weight, expected.weight), tol) << "grad weight";
        if (bias) EXPECT_LE(relative_error(ours.bias, expected.bias), tol) << "grad bias";
      }
}

// amp's case: fp32 hidden and master weight under autocast(bf16). The reference's linear runs in
// bf16 there; chunked_cuda's GEMMs too (not fp32, which missed the tensor cores), and the
// gradients come back fp32.
TEST(LinearCrossEntropyCuda, UnderAutocastMultipliesInItsDtype) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  OperatorTable::global().reset();
  const auto& ref = static_cast<const ops::OperatorImpl<ops::LinearCrossEntropy>&>(
      *OperatorTable::global().implementations("linear_cross_entropy").back());
  at::manual_seed(7);
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const at::Tensor h = at::randn({3000, 64}, opts), w = at::randn({50257, 64}, opts) * 0.3;
  const at::Tensor t = at::randint(50257, {3000}, opts.dtype(at::kLong));
  auto under_autocast = [](auto fn) {
    return [fn](auto&&... a) {
      const testing::CudaAutocast autocast(at::kBFloat16);
      return fn(a...);
    };
  };
  const Result expected = run(under_autocast(ref.fn()), h, w, at::Tensor(), t);
  const Result ours = run(under_autocast(kernels::linear_cross_entropy_chunked_cuda), h, w, at::Tensor(), t);
  EXPECT_EQ(ours.hidden.scalar_type(), at::kFloat);
  EXPECT_EQ(ours.weight.scalar_type(), at::kFloat);
  EXPECT_LE(relative_error(ours.loss, expected.loss), 2e-2) << "loss";
  EXPECT_LE(relative_error(ours.hidden, expected.hidden), 2e-2) << "grad hidden";
  EXPECT_LE(relative_error(ours.weight, expected.weight), 2e-2) << "grad weight";
  // Not the fp32 product: bf16 operands lose about 3 decimal digits.
  const Result fp32 = run(kernels::linear_cross_entropy_chunked_cuda, h, w, at::Tensor(), t);
  EXPECT_GT(relative_error(ours.hidden, fp32.hidden), 1e-6) << "the GEMMs ran in fp32 under autocast";
}

}  // namespace
}  // namespace strata
