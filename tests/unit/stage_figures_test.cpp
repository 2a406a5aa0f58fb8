// engine::StageFigures (core/src/engine/stage_figures.h) on a one-rank pipeline group: what it
// reports per step, and how it agrees the names anew when a figure first appears in a later read.
// The sums over several stages are the mixtral pipeline parity tests' (SAME_FIELDS).
#include "engine/stage_figures.h"

#include <gtest/gtest.h>

#include "strata/core/local_communicator.h"
#include "strata/step_program.h"

namespace strata::engine {
namespace {

at::Tensor value(double v) { return at::scalar_tensor(v, at::kDouble); }

std::vector<StageFigures::Named> read(StageFigures& figures, const std::vector<StageFigures::Figures>& steps) {
  return figures.decode(read_on_host({figures.reduce(steps)}), steps);
}

TEST(StageFigures, ReportsEachStepsNamesSummedByName) {
  auto group = local_communicator();
  StageFigures figures(*group, at::kCPU);
  // Two modules report moe_aux_loss in step 1; step 2 reports only one name.
  const auto out = read(figures, {{{"moe_aux_loss", value(0.25)}, {"moe_tokens_e0", value(3)}, {"moe_aux_loss", value(0.5)}},
                                  {{"moe_tokens_e0", value(4)}}});
  ASSERT_EQ(out.size(), 2u);
  const StageFigures::Named step1{{"moe_aux_loss", 0.75}, {"moe_tokens_e0", 3}}, step2{{"moe_tokens_e0", 4}};
  EXPECT_EQ(out[0], step1);
  EXPECT_EQ(out[1], step2);
}

TEST(StageFigures, AgreesAnewWhenANameFirstAppearsLater) {
  auto group = local_communicator();
  StageFigures figures(*group, at::kCPU);
  EXPECT_EQ(read(figures, {{{"a", value(1)}}}).at(0), (StageFigures::Named{{"a", 1}}));
  const int64_t reads_before = host_read_count();
  const auto out = read(figures, {{{"a", value(2)}, {"b", value(5)}}});
  EXPECT_EQ(out.at(0), (StageFigures::Named{{"a", 2}, {"b", 5}}));
  // The read above, then the names' lengths and text, then the sums again.
  EXPECT_EQ(host_read_count() - reads_before, 4);
  // Agreed now: one read.
  const int64_t reads_after = host_read_count();
  EXPECT_EQ(read(figures, {{{"b", value(6)}}}).at(0), (StageFigures::Named{{"b", 6}}));
  EXPECT_EQ(host_read_count() - reads_after, 1);
}

TEST(StageFigures, NoFiguresNoNames) {
  auto group = local_communicator();
  StageFigures figures(*group, at::kCPU);
  const auto out = read(figures, {{}, {}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].empty());
  EXPECT_TRUE(out[1].empty());
}

}  // namespace
}  // namespace strata::engine
