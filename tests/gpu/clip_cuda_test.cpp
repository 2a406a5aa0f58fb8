// clip_gradient_norm on a GPU (core/src/ir/job.cpp) computes its scale on the device and reads
// nothing to the host: the same norm and the same clipped gradients as on the CPU, where the
// norm is read and the scale is a host scalar. Cases: clipped, below max_norm (gradients
// untouched), max_norm 0 (norm only), a non-finite norm (left alone), sizes off the vector width.
// Skips without a CUDA device.
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/job.h"

namespace strata {
namespace {

std::vector<LocalGradient> gradients_on(const std::vector<at::Tensor>& grads, c10::Device device) {
  std::vector<LocalGradient> out;
  for (const auto& g : grads) out.push_back({g.to(device, /*non_blocking=*/false, /*copy=*/true), {}});
  return out;
}

TEST(ClipCuda, MatchesTheHostRule) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(0);
  const std::vector<at::Tensor> grads{at::randn({7}), at::randn({33, 5}), at::randn({1000})};
  const at::Tensor nan_grad = at::full({3}, std::numeric_limits<float>::quiet_NaN());
  struct Case {
    const char* what;
    double max_norm;
    bool with_nan;
  };
  for (const Case& c : {Case{"clipped", 1.0, false}, Case{"below max_norm", 1e6, false}, Case{"norm only", 0.0, false},
                        Case{"non-finite", 1.0, true}}) {
    SCOPED_TRACE(c.what);
    std::vector<at::Tensor> inputs = grads;
    if (c.with_nan) inputs.push_back(nan_grad);
    auto on_cpu = gradients_on(inputs, at::kCPU), on_gpu = gradients_on(inputs, at::kCUDA);
    const at::Tensor cpu_norm = clip_gradient_norm(on_cpu, c.max_norm, nullptr, at::kCPU);
    const at::Tensor gpu_norm = clip_gradient_norm(on_gpu, c.max_norm, nullptr, at::kCUDA);
    ASSERT_TRUE(gpu_norm.is_cuda());
    const double expected = cpu_norm.item<double>(), got = gpu_norm.item<double>();
    if (c.with_nan) EXPECT_TRUE(std::isnan(got));
    else EXPECT_NEAR(got, expected, 1e-6 * expected);
    for (size_t i = 0; i < inputs.size(); ++i)
      EXPECT_TRUE(at::allclose(on_gpu[i].grad.cpu(), on_cpu[i].grad, 1e-6, 0, /*equal_nan=*/true)) << "gradient " << i;
  }
}

}  // namespace
}  // namespace strata
