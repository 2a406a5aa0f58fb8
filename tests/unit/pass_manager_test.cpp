// Pass ordering: phases by default, after/before override, requirements, conflicts, cycles.
#include <gtest/gtest.h>

#include "strata/core/pass_manager.h"
#include "test_registry.h"

namespace strata {
namespace {

using test::FakePass;

struct Fixture {
  std::vector<std::unique_ptr<FakePass>> owned;
  std::vector<PassEntry> entries;

  Fixture& add(const std::string& name, Phase phase, StringList after = {}, StringList before = {},
               StringList requires_passes = {}, StringList conflicts = {}, bool enabled = true) {
    owned.push_back(std::make_unique<FakePass>(name, PassOrdering{phase, requires_passes, conflicts, after, before}));
    entries.push_back(PassEntry{owned.back().get(), enabled, {}, SourcePos{"s.toml", static_cast<int>(entries.size()) + 1, 1}});
    return *this;
  }

  std::vector<std::string> order(Diagnostics& d) const {
    std::vector<std::string> names;
    for (size_t i : order_passes(entries, d)) names.push_back(entries[i].pass->name());
    return names;
  }
};

using Names = std::vector<std::string>;

TEST(PassManager, PhasesGiveTheDefaultOrder) {
  Fixture f;
  f.add("ckpt_runtime", Phase::Runtime).add("fsdp", Phase::Wrapping).add("amp", Phase::Precision).add("tp", Phase::ModelRewrite);
  Diagnostics d;
  EXPECT_EQ(f.order(d), (Names{"tp", "amp", "fsdp", "ckpt_runtime"}));
  EXPECT_TRUE(d.ok());
}

TEST(PassManager, SamePhaseKeepsStrategyOrder) {
  Fixture f;
  f.add("b", Phase::Wrapping).add("a", Phase::Wrapping).add("c", Phase::Wrapping);
  Diagnostics d;
  EXPECT_EQ(f.order(d), (Names{"b", "a", "c"}));
}

TEST(PassManager, AfterAndBeforeOverridePhases) {
  Fixture f;
  f.add("late", Phase::Runtime, {}, {"early"}).add("early", Phase::Topology).add("mid", Phase::Wrapping, {"x_missing"});
  Diagnostics d;
  // late must precede early although its phase is later; x_missing is not enabled, so ignored.
  // Phases order only the passes free to run: mid goes before late, and early waits for late.
  EXPECT_EQ(f.order(d), (Names{"mid", "late", "early"}));
  EXPECT_TRUE(d.ok()) << d.str();
}

TEST(PassManager, DisabledPassesDoNotTakePart) {
  Fixture f;
  f.add("a", Phase::Wrapping, {}, {}, {}, {"b"}).add("b", Phase::Wrapping, {}, {}, {}, {}, false);
  Diagnostics d;
  EXPECT_EQ(f.order(d), (Names{"a"}));
  EXPECT_TRUE(d.ok());
}

TEST(PassManager, ConflictsAndMissingRequirementsAreAllReported) {
  Fixture f;
  f.add("ddp", Phase::Wrapping, {}, {}, {}, {"fsdp"})
      .add("fsdp", Phase::Wrapping, {}, {}, {}, {"ddp"})
      .add("wsam", Phase::Optimizer, {}, {}, {"ddp_hooks", "grad_sync"});
  Diagnostics d;
  EXPECT_TRUE(f.order(d).empty());
  std::string e = d.str();
  ASSERT_EQ(d.items().size(), 3u) << e;
  EXPECT_NE(e.find("s.toml:2:1: error: pass 'fsdp' conflicts with pass 'ddp' (at s.toml:1:1)"), std::string::npos) << e;
  EXPECT_NE(e.find("s.toml:3:1: error: pass 'wsam' requires pass 'ddp_hooks'"), std::string::npos) << e;
  EXPECT_NE(e.find("pass 'wsam' requires pass 'grad_sync'"), std::string::npos) << e;
}

// A conflict declared by one side only is found whichever of the two comes first.
TEST(PassManager, OneSidedConflictIsFoundInEitherOrder) {
  for (bool declarer_first : {true, false}) {
    Fixture f;
    if (declarer_first)
      f.add("fused_loss", Phase::ModelRewrite, {}, {}, {}, {"tp"}).add("tp", Phase::ModelRewrite);
    else
      f.add("tp", Phase::ModelRewrite).add("fused_loss", Phase::ModelRewrite, {}, {}, {}, {"tp"});
    Diagnostics d;
    EXPECT_TRUE(f.order(d).empty());
    ASSERT_EQ(d.items().size(), 1u) << d.str();
    const std::string want = declarer_first ? "s.toml:2:1: error: pass 'tp' conflicts with pass 'fused_loss' (at s.toml:1:1)"
                                            : "s.toml:2:1: error: pass 'fused_loss' conflicts with pass 'tp' (at s.toml:1:1)";
    EXPECT_NE(d.str().find(want), std::string::npos) << d.str();
  }
}

TEST(PassManager, CyclesAreNamed) {
  Fixture f;
  f.add("a", Phase::Wrapping, {"c"}).add("b", Phase::Wrapping, {"a"}).add("c", Phase::Wrapping, {"b"}).add("free", Phase::Topology);
  Diagnostics d;
  EXPECT_TRUE(f.order(d).empty());
  ASSERT_EQ(d.items().size(), 1u);
  EXPECT_NE(d.str().find("pass ordering has a cycle: a -> b -> c -> a"), std::string::npos) << d.str();
}

TEST(PassManager, OrderIsDeterministic) {
  Fixture f;
  f.add("z", Phase::Runtime).add("y", Phase::Precision, {}, {"x"}).add("x", Phase::Precision).add("w", Phase::Topology, {"z"});
  Diagnostics d1, d2;
  Names first = f.order(d1);
  EXPECT_EQ(first, (Names{"y", "x", "z", "w"}));
  EXPECT_EQ(first, f.order(d2));
}

}  // namespace
}  // namespace strata
