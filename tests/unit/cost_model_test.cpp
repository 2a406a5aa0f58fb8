// predicted_step_seconds (core/src/tune/cost_model.cpp): each term of the step-time formula on a
// hand-made estimate, and the parameter pass split by tensor x pipeline but not by data or context
// parallel (what made the model underestimate context parallel: bench/results/tune_cpu.md).
#include <gtest/gtest.h>

#include "strata/core/tune.h"

namespace strata {
namespace {

CostEstimate estimate(int64_t tensor, int64_t pipeline, int64_t context, int64_t micro_batches) {
  CostEstimate c;
  c.model.parameters = 1'000'000;
  c.model.layers = 4;
  c.tensor = tensor, c.pipeline = pipeline, c.context = context;
  c.micro_batches = micro_batches;
  c.layers_per_rank = 4.0 / static_cast<double>(pipeline);
  return c;
}

HardwareRates rates() {
  HardwareRates r;
  r.flops_per_s = 1e11, r.bytes_per_s = 1e9, r.message_latency_s = 1e-4, r.layer_overhead_s = 3e-4, r.parameter_pass_s = 1e-9;
  r.oversubscription = 2;
  return r;
}

TEST(CostModel, StepTimeAddsEveryTerm) {
  CostEstimate c = estimate(1, 1, 1, 2);
  c.flops = 1e9, c.comm_bytes = 1e6, c.messages = 10;
  const double compute = 1e9 / 1e11 * 2, overhead = 4 * 2 * 3e-4 * 2, parameter_pass = 1e6 * 2 * 1e-9 * 2;
  EXPECT_NEAR(predicted_step_seconds(c, rates()), compute + overhead + parameter_pass + 1e-3 + 10 * 1e-4, 1e-12);
}

TEST(CostModel, ParameterPassFollowsTheParametersARankComputesWith) {
  auto pass_only = [](const CostEstimate& c) {
    HardwareRates r = rates();
    r.layer_overhead_s = 0;
    return predicted_step_seconds(c, r);
  };
  const double whole = pass_only(estimate(1, 1, 1, 4));
  EXPECT_NEAR(pass_only(estimate(2, 1, 1, 4)), whole / 2, 1e-12);   // tensor parallel splits the weights
  EXPECT_NEAR(pass_only(estimate(1, 4, 1, 4)), whole / 4, 1e-12);   // so does a pipeline
  EXPECT_NEAR(pass_only(estimate(1, 1, 4, 4)), whole, 1e-12);       // context parallel does not
  EXPECT_NEAR(pass_only(estimate(1, 1, 1, 1)), whole / 4, 1e-12);   // once per micro-batch
}

}  // namespace
}  // namespace strata
