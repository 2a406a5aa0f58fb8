// rope.fused_cuda (kernels/cuda/rope_kernels.cu) on a GPU against core's rope.reference on the
// same GPU: the output and x's gradient bit for bit (the kernel rounds each product and sum as
// the reference's separate kernels do), in float, bfloat16 and half; x as the Llama passes it
// (the heads' transposed view of a projection) and contiguous; cos/sin as [T, D/2] and as
// [B, 1, T, D/2] (packed documents); a dy that is not contiguous; and calls the kernel does not
// take (fp64, an odd head size) served by the reference. Skips without a CUDA device.
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "strata/core/operator_table.h"

#ifdef STRATA_HAVE_CUDA_KERNELS
#include "cuda/rope_cuda.h"
#endif

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

struct Result {
  at::Tensor y, dx;
};

template <class Fn>
Result run(Fn fn, const at::Tensor& x0, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& dy, bool transposed) {
  // transposed: x is [B, T, H, D] laid out, viewed as [B, H, T, D], as Llama's heads() gives it.
  at::Tensor leaf = (transposed ? x0.transpose(1, 2).contiguous() : x0.clone()).requires_grad_(true);
  const at::Tensor x = transposed ? leaf.transpose(1, 2) : leaf;
  const at::Tensor y = fn(x, cos, sin);
  const auto grads = torch::autograd::grad({y}, {leaf}, {dy});
  return {y.detach(), transposed ? grads[0].transpose(1, 2) : grads[0]};
}

const ops::OperatorImpl<ops::Rope>& reference() {
  OperatorTable::global().reset();
  const auto& ref = static_cast<const ops::OperatorImpl<ops::Rope>&>(*OperatorTable::global().implementations("rope").back());
  EXPECT_EQ(ref.name(), "rope.reference");
  return ref;
}

TEST(RopeCuda, EqualsTheReferenceBitForBit) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto& ref = reference();
  const auto on = at::TensorOptions().device(at::kCUDA);
  const int64_t b = 2, h = 4, t = 33, d = 64;
  const at::Tensor angles = at::outer(at::arange(t, on.dtype(at::kFloat)), at::rand({d / 2}, on));
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const bool transposed : {true, false})
      for (const bool per_sequence : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(type)) + (transposed ? " transposed" : " contiguous") +
                     (per_sequence ? " [B, 1, T, D/2] tables" : " [T, D/2] tables"));
        at::manual_seed(5);
        const at::Tensor x = (at::randn({b, h, t, d}, on) * 3).to(type);
        at::Tensor cos = angles.cos(), sin = angles.sin();
        if (per_sequence) {  // each sequence its own positions
          const at::Tensor positions = at::stack({at::arange(t, on.dtype(at::kLong)), at::arange(t, on.dtype(at::kLong)).flip(0)});
          cos = at::embedding(cos, positions).unsqueeze(1), sin = at::embedding(sin, positions).unsqueeze(1);
        }
        // dy not contiguous: a transposed view.
        const at::Tensor dy = at::randn({b, t, h, d}, on).to(type).transpose(1, 2);
        const Result ours = run(kernels::rope_fused_cuda, x, cos, sin, dy, transposed);
        const Result theirs = run(ref.fn(), x, cos, sin, dy, transposed);
        EXPECT_TRUE(at::equal(ours.y, theirs.y)) << "y, largest difference "
                                                 << (ours.y.to(at::kDouble) - theirs.y.to(at::kDouble)).abs().max().item<double>();
        EXPECT_TRUE(at::equal(ours.dx, theirs.dx)) << "dx, largest difference "
                                                   << (ours.dx.to(at::kDouble) - theirs.dx.to(at::kDouble)).abs().max().item<double>();
      }
}

TEST(RopeCuda, CallsItDoesNotTakeGoToTheReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto& ref = reference();
  const auto on = at::TensorOptions().device(at::kCUDA);
  const at::Tensor angles = at::outer(at::arange(8, on.dtype(at::kFloat)), at::rand({4}, on));
  const at::Tensor x = at::randn({1, 2, 8, 8}, on.dtype(at::kDouble));
  EXPECT_TRUE(at::equal(kernels::rope_fused_cuda(x, angles.cos(), angles.sin()), ref.fn()(x, angles.cos(), angles.sin())));
  const at::Tensor odd = at::randn({1, 2, 8, 7}, on);  // no even split: the reference's own error
  EXPECT_THROW(kernels::rope_fused_cuda(odd, angles.cos(), angles.sin()), c10::Error);
}

#else
TEST(RopeCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
