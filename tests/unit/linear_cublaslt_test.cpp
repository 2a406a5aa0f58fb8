// linear.cublaslt_cuda's CPU-visible half (kernels/cuda/linear_cublaslt_cuda.h): its autograd
// function on CPU bf16 and fp16 tensors, where the weight and bias gradients take ATen's way (as
// on a GPU where cuBLASLt offers no algorithm), against at::linear: the forward and all three
// gradients bit for bit, 2-D and 3-D inputs, frozen inputs. And that the kernels plugin registers
// it opt-in (priority 0), so that nothing selects it unless a strategy pins it (and
// layer_norm.autocast_out_cuda, rms_norm.autocast_out_cuda and rope.fused_cuda, also written
// without a GPU). The cuBLASLt GEMM
// itself runs on a GPU only (tests/gpu/linear_cublaslt_cuda_test.cpp).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "strata/core/component_registry.h"
#include "strata/core/operator_table.h"
#include "strata/core/plugin_loader.h"
#include "strata/ops.h"

#ifdef STRATA_HAVE_CUDA_KERNELS
#include "cuda/linear_cublaslt_cuda.h"
#endif

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

TEST(LinearCublasLt, AutogradFunctionMatchesAtenLinearWhereTheGemmFallsBack) {
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf})
    for (const bool three_d : {false, true})
      for (const bool frozen_x : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + (three_d ? " 3-D" : " 2-D") + (frozen_x ? " frozen x" : ""));
        at::manual_seed(3);
        const at::Tensor x0 = (three_d ? at::randn({2, 5, 24}) : at::randn({10, 24})).to(dtype);
        const at::Tensor w0 = (at::randn({16, 24}) * 0.2).to(dtype), b0 = at::randn({16}).to(dtype);
        const at::Tensor dy = at::randn(three_d ? std::vector<int64_t>{2, 5, 16} : std::vector<int64_t>{10, 16}).to(dtype);
        std::vector<at::Tensor> grads[2], outputs(2);
        for (int which = 0; which < 2; ++which) {
          const at::Tensor x = x0.clone().requires_grad_(!frozen_x), w = w0.clone().requires_grad_(true),
                           b = b0.clone().requires_grad_(true);
          outputs[which] = which == 0 ? kernels::linear_bias_gradient_in_gemm(x, w, b) : at::linear(x, w, b);
          std::vector<at::Tensor> inputs{w, b};
          if (!frozen_x) inputs.push_back(x);
          grads[which] = torch::autograd::grad({outputs[which]}, inputs, {dy});
        }
        EXPECT_EQ(outputs[0].sizes(), outputs[1].sizes());
        EXPECT_TRUE(at::equal(outputs[0], outputs[1])) << "y";
        for (size_t i = 0; i < grads[0].size(); ++i) {
          EXPECT_EQ(grads[0][i].scalar_type(), dtype);
          EXPECT_TRUE(at::allclose(grads[0][i].to(at::kFloat), grads[1][i].to(at::kFloat), 2e-2, 2e-2)) << "gradient " << i;
        }
      }
}

// Both CUDA implementations written without a GPU (2026-11-30) wait, opt-in, for a GPU run.
TEST(LinearCublasLt, RegisteredOptInSoNothingSelectsItUnpinned) {
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  for (const auto& [op, name] : {std::pair<std::string, std::string>{"linear", "linear.cublaslt_cuda"},
                                 {"layer_norm", "layer_norm.autocast_out_cuda"}, {"rms_norm", "rms_norm.autocast_out_cuda"},
                                 {"rope", "rope.fused_cuda"}}) {
    SCOPED_TRACE(name);
    const auto impls = ops::implementations(op);
    const auto it = std::find_if(impls.begin(), impls.end(), [&](const auto* i) { return i->name() == name; });
    ASSERT_NE(it, impls.end());
    EXPECT_EQ((*it)->priority(), 0);
    EXPECT_TRUE((*it)->support().accepts(c10::DeviceType::CUDA, at::kFloat));
    EXPECT_FALSE((*it)->support().accepts(c10::DeviceType::CPU, at::kFloat));
    EXPECT_EQ(impls.back()->name(), op + ".reference");
  }
  OperatorTable::global().reset();
}

#else
TEST(LinearCublasLt, BuiltWithoutTheCudaToolkit) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
