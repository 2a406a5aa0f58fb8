// rms_norm.fused_cpu (kernels/cpu/rms_norm.cpp) against core's rms_norm.reference
// (tests/rms_norm_cases.h): rows 1 to 3000 (more rows than threads, groups that do not divide
// them), widths below, at and above the eight lanes (1, 7, 8, 9, 256, 100, 1000); a 3-D input, a
// weight dtype the kernel does not take (served by the reference); and the plugin serving it.
#include <gtest/gtest.h>

#include "cpu/rms_norm.h"
#include "strata/core/component_registry.h"
#include "strata/core/plugin_loader.h"
#include "../rms_norm_cases.h"

namespace strata {
namespace {

TEST(RmsNormKernel, MatchesTheReference) {
  testing::expect_rms_norm_matches_reference(kernels::rms_norm_fused_cpu, at::kCPU,
                                             {{1, 1}, {7, 7}, {5, 8}, {3, 9}, {33, 256}, {3000, 100}, {64, 1000}});
}

TEST(RmsNormKernel, ThreeDimensionalInputAndAWeightItDoesNotTake) {
  testing::expect_rms_norm_3d_and_fallback(kernels::rms_norm_fused_cpu, at::kCPU);
}

TEST(RmsNormKernel, TheKernelsPluginServesIt) {
  ComponentRegistry registry;
  PluginLoader(registry).load_search_path({STRATA_KERNELS_PLUGIN});
  OperatorTable::global().install(registry);
  EXPECT_EQ(ops::select("rms_norm", at::randn({3, 5})).name(), "rms_norm.fused_cpu");
  EXPECT_EQ(ops::select("rms_norm", at::randn({3, 5}, at::kDouble)).name(), "rms_norm.reference");
  OperatorTable::global().reset();
}

}  // namespace
}  // namespace strata
