// The step program and pass claims: plan-time checks of dimensions and stage owners, run-time
// refusal of undeclared stages, wrapper order, and flattened mesh groups.
#include <optional>

#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "strata/core/pass_manager.h"
#include "strata/core/step_plan.h"
#include "strata/job.h"
#include "strata/nn.h"
#include "test_registry.h"

namespace strata {
namespace {

using test::FakePass;

struct ClaimsFixture {
  std::vector<std::unique_ptr<FakePass>> owned;
  ResolvedStrategy plan;
  ComponentRegistry registry;

  ClaimsFixture& add(const std::string& name, Claims claims, StringList conflicts = {}) {
    owned.push_back(std::make_unique<FakePass>(name, PassOrdering{Phase::Wrapping, {}, conflicts, {}, {}}, Schema{}, claims));
    plan.passes.push_back(PassEntry{owned.back().get(), true, {}, SourcePos{"s.toml", static_cast<int>(plan.passes.size()) + 1, 1}});
    return *this;
  }
  std::string check() {
    Diagnostics d;
    check_claims(plan, registry, d);
    return d.str();
  }
};

TEST(Claims, UnclaimedDimensionLargerThanOneIsRefused) {
  ClaimsFixture f;
  f.plan.layout = ParallelLayout{4, {2, 2, 1, 1}, {}};
  f.add("dp", {{Dim::Data}, {}});
  const std::string errors = f.check();
  EXPECT_NE(errors.find("[parallel] tensor = 2 but no enabled pass claims the tensor dimension"), std::string::npos) << errors;
  EXPECT_EQ(errors.find("data"), std::string::npos) << errors;
}

TEST(Claims, SizeOneNeedsNoClaim) {
  ClaimsFixture f;
  f.plan.layout = ParallelLayout{1, {1, 1, 1, 1}, {}};
  EXPECT_EQ(f.check(), "");
}

TEST(Claims, TwoPassesClaimingOneDimensionConflict) {
  ClaimsFixture f;
  f.plan.layout = ParallelLayout{2, {2, 1, 1, 1}, {}};
  f.add("a", {{Dim::Data}, {}}).add("b", {{Dim::Data}, {}});
  EXPECT_NE(f.check().find("pass 'b' and pass 'a' (at s.toml:1:1) both claim the data dimension"), std::string::npos) << f.check();
}

TEST(Claims, DeclaredConflictIsNotReportedTwice) {
  ClaimsFixture f;
  f.plan.layout = ParallelLayout{2, {2, 1, 1, 1}, {}};
  f.add("a", {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}}, {"b"}).add("b", {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}});
  EXPECT_EQ(f.check(), "");  // order_passes reports the declared conflict
}

TEST(Claims, TwoOwnersOfAStageConflict) {
  ClaimsFixture f;
  f.plan.layout = ParallelLayout{1, {1, 1, 1, 1}, {}};
  f.add("pipe", {{}, {{Stage::ForwardBackward, StageUse::Own}}}).add("other", {{}, {{Stage::ForwardBackward, StageUse::Own}}});
  EXPECT_NE(f.check().find("both own the step stage 'forward_backward'"), std::string::npos) << f.check();
}

TEST(Claims, PlannedProgramShowsOwnersAndWrappersInOrder) {
  ClaimsFixture f;
  f.add("amp", {{}, {{Stage::Gradients, StageUse::Wrap}}})
      .add("ddp", {{Dim::Data}, {{Stage::SyncGradients, StageUse::Own}}})
      .add("wsam", {{}, {{Stage::Gradients, StageUse::Wrap}}});
  const StepProgram program = planned_step_program(f.plan, {0, 1, 2});
  EXPECT_EQ(program.provider(Stage::SyncGradients), "ddp");
  EXPECT_EQ(program.wrappers(Stage::Gradients), (std::vector<std::string>{"amp", "wsam"}));
  const std::string text = describe_step_program(program);
  EXPECT_NE(text.find("gradients           core: forward_backward, then sync_gradients; wrapped by amp, then wsam"), std::string::npos)
      << text;
  EXPECT_NE(text.find("    sync_gradients    pass ddp"), std::string::npos) << text;
}

TEST(StepProgram, WrappersRunOutermostLastAppliedAndOwnerAfterWrapperIsWrapped) {
  StepProgram program;
  std::string trace;
  program.provide(Stage::Gradients, "core", [&](StepContext&) { trace += "core;"; });
  program.begin_pass("inner", {{}, {{Stage::Gradients, StageUse::Wrap}}});
  program.wrap(Stage::Gradients, [&](StepContext& c, const StageFn& next) { trace += "inner>"; next(c); trace += "<inner;"; });
  program.end_pass();
  program.begin_pass("outer", {{}, {{Stage::Gradients, StageUse::Wrap}}});
  program.wrap(Stage::Gradients, [&](StepContext& c, const StageFn& next) { trace += "outer>"; next(c); trace += "<outer;"; });
  program.end_pass();
  program.begin_pass("owner", {{}, {{Stage::Gradients, StageUse::Own}}});
  program.own(Stage::Gradients, [&](StepContext&) { trace += "owner;"; });
  program.end_pass();
  StepContext context;
  program.run(Stage::Gradients, context);
  EXPECT_EQ(trace, "outer>inner>owner;<inner;<outer;");
}

TEST(StepProgram, UndeclaredStageIsRefused) {
  StepProgram program;
  program.provide(Stage::SyncGradients, "core", [](StepContext&) {});
  program.begin_pass("sneaky", {{}, {{Stage::Gradients, StageUse::Wrap}}});
  EXPECT_THROW(program.own(Stage::SyncGradients, [](StepContext&) {}), std::logic_error);
  EXPECT_THROW(program.wrap(Stage::ClipGradients, [](StepContext&, const StageFn&) {}), std::logic_error);
  program.end_pass();
  EXPECT_THROW(program.wrap(Stage::Gradients, [](StepContext&, const StageFn&) {}), std::logic_error);  // outside apply()
}

TEST(StepProgram, SecondOwnerIsRefused) {
  StepProgram program;
  program.provide(Stage::ForwardBackward, "core", [](StepContext&) {});
  const Claims owns{{}, {{Stage::ForwardBackward, StageUse::Own}}};
  program.begin_pass("a", owns);
  program.own(Stage::ForwardBackward, [](StepContext&) {});
  program.end_pass();
  program.begin_pass("b", owns);
  EXPECT_THROW(program.own(Stage::ForwardBackward, [](StepContext&) {}), std::logic_error);
}

// ABI 1.4: amp's fp16 scaler hands core a scale and a skip flag that stay on the device.
TEST(StepProgram, DeviceLossScaleReachesAuxiliaryLossesAndGoesWithTheProgram) {
  at::Tensor p = at::randn({5}, at::kFloat).requires_grad_();
  auto grad_of = [&](std::optional<double> device_scale) {
    StepProgram program;
    if (device_scale) program.set_device_loss_scale(at::full({}, *device_scale, at::kDouble));
    const at::Tensor out = p * 3.0, aux = (p * p).sum();
    {
      const nn::LossGradientScale weight(0.5);
      at::Tensor root = nn::add_auxiliary_loss(out, aux).sum() * 0.5;
      if (const at::Tensor scale = program.device_loss_scale(); scale.defined()) root = root * scale;
      root.backward();
    }
    at::Tensor g = p.grad().clone();
    p.mutable_grad() = at::Tensor();
    return g;
  };
  const at::Tensor plain = grad_of(std::nullopt), scaled = grad_of(1024.0);
  EXPECT_TRUE(scaled.equal(plain * 1024)) << "the auxiliary loss's gradient is scaled like the main loss's";
  EXPECT_TRUE(grad_of(std::nullopt).equal(plain)) << "a program's scale leaves with the program";
}

TEST(StepProgram, SkipFlagsCombineOnTheDeviceAndReadsAreCounted) {
  StepProgram program;
  EXPECT_FALSE(program.skip_flag().defined());
  const at::Tensor first = at::zeros({1}, at::kFloat), second = at::zeros({}, at::kLong);
  program.add_skip_flag(first);
  EXPECT_TRUE(program.skip_flag().is_same(first.reshape({})) || program.skip_flag().data_ptr() == first.data_ptr())
      << "one flag is handed on as it is";
  program.add_skip_flag(second);
  const int64_t reads = host_read_count();
  EXPECT_EQ(read_on_host({program.skip_flag()})[0], 0.0);
  second.fill_(3);  // set in place by its owner, as amp sets its flag each step
  EXPECT_EQ(read_on_host({program.skip_flag()})[0], 1.0);
  EXPECT_EQ(host_read_count() - reads, 2);
  EXPECT_THROW(program.add_skip_flag(at::zeros({2})), std::logic_error);
  EXPECT_THROW(program.set_device_loss_scale(at::ones({}, at::kLong)), std::logic_error);
}

TEST(Mesh, FlattenedGroupsAndNeighbours) {
  // data 2 x context 2 x tensor 2, order tensor (innermost), context, pipeline, data.
  Topology t({{Dim::Data, 2}, {Dim::Tensor, 2}, {Dim::Pipeline, 1}, {Dim::Context, 2}},
             {Dim::Tensor, Dim::Context, Dim::Pipeline, Dim::Data}, 5);
  EXPECT_EQ(t.group_ranks(Dim::Tensor), (std::vector<int>{4, 5}));
  EXPECT_EQ(t.group_ranks(Dim::Context), (std::vector<int>{5, 7}));
  EXPECT_EQ(t.group_ranks(Dim::Data), (std::vector<int>{1, 5}));
  EXPECT_EQ(t.group_ranks({Dim::Data, Dim::Context}, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(t.rank_in({Dim::Data, Dim::Context}), 2);
  EXPECT_EQ(t.size({Dim::Data, Dim::Context}), 4);
  EXPECT_EQ(t.neighbour(Dim::Context, 1), 7);
  EXPECT_EQ(t.neighbour(Dim::Context, -1), 7);
  EXPECT_EQ(t.neighbour(Dim::Tensor, 1), 4);
}

}  // namespace
}  // namespace strata
