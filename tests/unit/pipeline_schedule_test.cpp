// Every bundled pipeline schedule, for p = 2..8 ranks and m = 1..16 micro-batches (interleaved:
// the shapes it accepts, v = 2 and 3), runs every action exactly once and never deadlocks, by
// simulation of the programs the runtime executes; and the simulator catches broken programs.
#include <gtest/gtest.h>

#include "strata/core/plugin_loader.h"
#include "strata/core/schedules.h"
#include "strata/pipeline.h"

namespace strata::pipeline {
namespace {

const Schedule& schedule(const std::string& name) {
  static ComponentRegistry* registry = [] {
    auto* r = new ComponentRegistry();
    PluginLoader(*r).load_search_path({installed_plugin_dir()});
    install_schedules(*r);
    return r;
  }();
  (void)registry;
  const Schedule* s = find_schedule(name);
  if (!s) throw std::runtime_error("no schedule " + name);
  return *s;
}

TEST(PipelineSchedule, EveryBundledScheduleRunsEveryActionOnceWithoutDeadlock) {
  int shapes = 0;
  for (const char* name : {"gpipe", "1f1b", "interleaved", "zero_bubble"})
    for (int p = 2; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m)
        for (int v : {1, 2, 3}) {
          const Schedule& s = schedule(name);
          if (s.chunks(v) != v) continue;
          const ScheduleShape shape{p, m, v};
          if (!s.shape_problem(shape).empty()) continue;
          const Simulation sim = simulate(add_communication(s.compute_order(shape), shape), shape);
          ASSERT_EQ(sim.problem, "") << name << " p=" << p << " m=" << m << " v=" << v;
          size_t computes = 0;
          for (const auto& rank : sim.timeline) computes += rank.size();
          const size_t per_micro = std::string(name) == "zero_bubble" ? 3 : 2;
          EXPECT_EQ(computes, per_micro * static_cast<size_t>(p * m * v)) << name << " p=" << p << " m=" << m;
          ++shapes;
        }
  EXPECT_GT(shapes, 4 * 7 * 16 / 2);
}

TEST(PipelineSchedule, BubblesMatchTheTextbook) {
  // GPipe and 1F1B idle (p-1)/(m+p-1) of the step when backward costs twice a forward.
  for (const char* name : {"gpipe", "1f1b"}) {
    const ScheduleShape shape{4, 8, 1};
    const Simulation sim = simulate(add_communication(schedule(name).compute_order(shape), shape), shape);
    EXPECT_NEAR(sim.idle_fraction, 3.0 / 11.0, 1e-9) << name;
  }
  // 1F1B holds at most p - r micro-batches; GPipe all m.
  const ScheduleShape shape{4, 8, 1};
  EXPECT_EQ(simulate(add_communication(schedule("1f1b").compute_order(shape), shape), shape).peak_in_flight,
            (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(simulate(add_communication(schedule("gpipe").compute_order(shape), shape), shape).peak_in_flight,
            (std::vector<int>{8, 8, 8, 8}));
  // Zero bubble holds a micro-batch until its deferred weight gradients have run (they keep the
  // linears' inputs and output gradients): more than 1F1B where they wait for the step's end.
  const std::vector<int> zero_bubble = simulate(add_communication(schedule("zero_bubble").compute_order(shape), shape), shape).peak_in_flight;
  for (size_t r = 0; r < 4; ++r) EXPECT_GE(zero_bubble[r], static_cast<int>(4 - r)) << r;
  EXPECT_GT(zero_bubble[3], 1);
  // Zero bubble fills 1F1B's bubble with weight gradients; interleaving shrinks it.
  const double one_f_one_b = simulate(add_communication(schedule("1f1b").compute_order(shape), shape), shape).idle_fraction;
  EXPECT_LT(simulate(add_communication(schedule("zero_bubble").compute_order(shape), shape), shape).idle_fraction, one_f_one_b);
  const ScheduleShape two_chunks{4, 8, 2};
  EXPECT_LT(simulate(add_communication(schedule("interleaved").compute_order(two_chunks), two_chunks), two_chunks).idle_fraction,
            one_f_one_b);
}

TEST(PipelineSchedule, SimulationNamesWhatIsWrong) {
  const ScheduleShape shape{2, 2, 1};
  Programs good = add_communication(schedule("1f1b").compute_order(shape), shape);
  // A missing backward.
  Programs missing = schedule("1f1b").compute_order(shape);
  missing[1].pop_back();
  EXPECT_NE(simulate(add_communication(missing, shape), shape).problem.find("has no backward of micro-batch 1"), std::string::npos);
  // Rank 0 waits for a gradient before sending the activation that produces it: deadlock.
  Programs swapped{{{ActionKind::Forward, 0, 0}, {ActionKind::Backward, 0, 0}, {ActionKind::Forward, 1, 0}, {ActionKind::Backward, 1, 0}},
                   {{ActionKind::Forward, 0, 0}, {ActionKind::Backward, 0, 0}, {ActionKind::Forward, 1, 0}, {ActionKind::Backward, 1, 0}}};
  Programs lowered = add_communication(swapped, shape);
  std::swap(lowered[0][1], lowered[0][2]);  // recv_gradient(0) before send_activation(0)
  const std::string problem = simulate(lowered, shape).problem;
  EXPECT_NE(problem.find("deadlock"), std::string::npos) << problem;
  EXPECT_EQ(simulate(good, shape).problem, "");
}

}  // namespace
}  // namespace strata::pipeline
