// gelu.fused_cuda and swiglu.fused_cuda (kernels/cuda/activation_kernels.cu) on a GPU: values and
// gradients against the formulas in fp64 and against core's references (ATen's gelu "tanh";
// silu(gate) * up) on the same GPU, at sizes that do and do not fill a block of 256 threads, one
// large enough for the grid-stride loop to wrap (2^28 + 3 > 65536 blocks x 256 threads x 8),
// inputs out to +-30 where exp saturates, non-contiguous and unaligned inputs (the vectorised and
// the one-element paths), fp32, bf16 and half (their registration: kernels.Activations.
// TheKernelsPluginServesTheOperators). Skips without a CUDA device (or a build without nvcc).
#include <functional>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cuda/activations_cuda.h"
#include "../elementwise_error.h"

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

using testing::max_elementwise_error;

at::Tensor inputs(int64_t n, at::ScalarType dtype, int64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({n}, at::kDouble) * 3;
  if (n >= 4) x.narrow(0, 0, 4).copy_(at::tensor({30.0, -30.0, 0.0, -9.0}, at::kDouble));
  return x.to(at::TensorOptions().device(at::kCUDA).dtype(dtype));
}

struct Result {
  at::Tensor y, dx, du;
};

Result gelu_run(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y = fn(x);
  return {y.detach(), torch::autograd::grad({y}, {x}, {dy})[0], at::Tensor()};
}

Result swiglu_run(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn, const at::Tensor& g0,
                  const at::Tensor& u0, const at::Tensor& dy) {
  at::Tensor g = g0.clone().requires_grad_(true), u = u0.clone().requires_grad_(true);
  at::Tensor y = fn(g, u);
  const auto grads = torch::autograd::grad({y}, {g, u}, {dy});
  return {y.detach(), grads[0], grads[1]};
}

at::Tensor gelu_formula(const at::Tensor& x) { return 0.5 * x * (1 + at::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
at::Tensor swiglu_formula(const at::Tensor& g, const at::Tensor& u) { return g * at::sigmoid(g) * u; }
at::Tensor gelu_reference(const at::Tensor& x) { return at::gelu(x, "tanh"); }
at::Tensor swiglu_reference(const at::Tensor& g, const at::Tensor& u) { return at::silu(g) * u; }

TEST(ActivationsCuda, MatchTheFormulasAndTheReferences) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  // fp32: a few ulp; 16-bit storage: both round once from float, a unit in the last place.
  for (auto [dtype, tol] : {std::pair{at::kFloat, 4e-6}, std::pair{at::kBFloat16, 8e-3}, std::pair{at::kHalf, 1e-3}})
    for (int64_t n : {1L, 7L, 255L, 256L, 257L, 70001L, (1L << 28) + 3}) {
      if (n > (1L << 24) && dtype != at::kBFloat16) continue;  // the wrapping grid once (2 x 512 MiB of bf16)
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " n " + std::to_string(n));
      const at::Tensor x = dtype == at::kFloat ? inputs(n, dtype, n) : inputs(n, at::kFloat, n).clamp(-9, 9).to(dtype);
      const at::Tensor u = (inputs(n, at::kFloat, n + 1) / 3).to(dtype), dy = at::randn({n}, x.options());
      const Result ours = gelu_run(kernels::gelu_tanh_fused_cuda, x, dy);
      const Result exact = gelu_run(gelu_formula, x.to(at::kDouble), dy.to(at::kDouble));
      const Result reference = gelu_run(gelu_reference, x, dy);
      EXPECT_EQ(ours.y.scalar_type(), dtype);
      EXPECT_EQ(ours.dx.scalar_type(), dtype);
      EXPECT_LE(max_elementwise_error(ours.y, exact.y), tol) << "gelu";
      EXPECT_LE(max_elementwise_error(ours.dx, exact.dx), 2 * tol) << "gelu grad";
      EXPECT_LE(max_elementwise_error(ours.y, reference.y), 2 * tol) << "gelu vs reference";
      EXPECT_LE(max_elementwise_error(ours.dx, reference.dx), 4 * tol) << "gelu grad vs reference";
      const Result s_ours = swiglu_run(kernels::swiglu_fused_cuda, x, u, dy);
      const Result s_exact = swiglu_run(swiglu_formula, x.to(at::kDouble), u.to(at::kDouble), dy.to(at::kDouble));
      const Result s_ref = swiglu_run(swiglu_reference, x, u, dy);
      EXPECT_LE(max_elementwise_error(s_ours.y, s_exact.y), 2 * tol) << "swiglu";
      EXPECT_LE(max_elementwise_error(s_ours.dx, s_exact.dx), 4 * tol) << "swiglu grad gate";
      EXPECT_LE(max_elementwise_error(s_ours.du, s_exact.du), 2 * tol) << "swiglu grad up";
      EXPECT_LE(max_elementwise_error(s_ours.y, s_ref.y), 2 * tol) << "swiglu vs reference";
      EXPECT_LE(max_elementwise_error(s_ours.dx, s_ref.dx), 4 * tol) << "swiglu grad gate vs reference";
      EXPECT_LE(max_elementwise_error(s_ours.du, s_ref.du), 2 * tol) << "swiglu grad up vs reference";
      EXPECT_FALSE(ours.dx.isnan().any().item<bool>() || s_ours.dx.isnan().any().item<bool>());
    }
}

TEST(ActivationsCuda, NonContiguousInputsAndGradients) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor wide = inputs(2 * 4 * 37, at::kFloat, 5).view({4, 74});
  const at::Tensor gate = wide.narrow(1, 0, 37), up = wide.narrow(1, 37, 37);  // Llama's chunked projection
  const at::Tensor dy = at::randn({37, 4}, wide.options()).t();                // a transposed gradient
  const Result ours = swiglu_run(kernels::swiglu_fused_cuda, gate, up, dy), reference = swiglu_run(swiglu_reference, gate, up, dy);
  EXPECT_LE(max_elementwise_error(ours.y, reference.y), 4e-6);
  EXPECT_LE(max_elementwise_error(ours.dx, reference.dx), 8e-6);
  EXPECT_LE(max_elementwise_error(ours.du, reference.du), 4e-6);
  const Result g_ours = gelu_run(kernels::gelu_tanh_fused_cuda, gate, dy), g_ref = gelu_run(gelu_reference, gate, dy);
  EXPECT_LE(max_elementwise_error(g_ours.y, g_ref.y), 4e-6);
  EXPECT_LE(max_elementwise_error(g_ours.dx, g_ref.dx), 8e-6);
  // Contiguous but one element into its storage: not 16-byte aligned, the one-element-at-a-time path.
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = inputs(1001, at::kFloat, 9).clamp(-9, 9).to(dtype).narrow(0, 1, 1000), d = at::randn({1000}, x.options());
    const double tol = dtype == at::kFloat ? 4e-6 : 1.6e-2;
    EXPECT_LE(max_elementwise_error(kernels::gelu_tanh_fused_cuda(x), gelu_reference(x)), tol) << dtype;
    EXPECT_LE(max_elementwise_error(kernels::swiglu_fused_cuda(x, d), swiglu_reference(x, d)), tol) << dtype;
  }
}

#else
TEST(ActivationsCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
