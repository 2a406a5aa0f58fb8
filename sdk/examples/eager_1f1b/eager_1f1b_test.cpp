// The schedule is valid by core's simulation for every shape a user may ask for, and holds
// one more micro-batch in flight than 1F1B.
#include <algorithm>

#include <gtest/gtest.h>

#include "strata/core/component_registry.h"
#include "strata/pipeline.h"
#include "strata/testing.h"

namespace {

TEST(Eager1F1B, RunsEveryActionOnceWithoutDeadlock) {
  auto registry = strata::testing::load_plugins({EAGER_1F1B_PLUGIN_DIR});
  const auto* schedule = dynamic_cast<const strata::pipeline::Schedule*>(
      registry->find(strata::ComponentKind::Schedule, "eager_1f1b"));
  ASSERT_NE(schedule, nullptr);
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const strata::pipeline::ScheduleShape shape{p, m, 1};
      const auto sim = strata::pipeline::simulate(strata::pipeline::add_communication(schedule->compute_order(shape), shape), shape);
      ASSERT_EQ(sim.problem, "") << "p " << p << " m " << m;
      for (int r = 0; r < p; ++r) EXPECT_EQ(sim.peak_in_flight[static_cast<size_t>(r)], std::min(p - r + 1, m)) << "p " << p << " m " << m;
    }
}

}  // namespace
