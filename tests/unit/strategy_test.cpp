// Strategy parsing, overrides and resolution: every error carries its position.
#include <gtest/gtest.h>

#include "strata/core/strategy.h"
#include "test_registry.h"

namespace strata {
namespace {

const char* kGood = R"(# a comment
[job]
model = "tiny"
dataset = "toy"
steps = 10

[model]
width = 16

[data]
path = "corpus.txt"

[optimizer]
lr = 1e-3
beta1 = 0.8

[[pass]]
name = "alpha"
dtype = "fp16"

[[pass]]
name = "beta"
enabled = false
)";

struct Result {
  ResolvedStrategy plan;
  Diagnostics diagnostics;
};

Result resolve_text(const std::string& text, const StringList& sets = {}, const StringList& disables = {},
                    int64_t world = 1) {
  static auto registry = test::make_test_registry();
  Result r;
  RawStrategy raw = parse_strategy_text(text, "s.toml", r.diagnostics);
  apply_overrides(raw, sets, disables, r.diagnostics);
  r.plan = resolve_strategy(raw, *registry, world, r.diagnostics);
  return r;
}

std::string errors(const Result& r) { return r.diagnostics.str(); }

TEST(Strategy, GoodStrategyResolvesWithDefaultsAndOrigins) {
  Result r = resolve_text(kGood);
  ASSERT_TRUE(r.diagnostics.ok()) << errors(r);
  EXPECT_EQ(r.plan.job.get_int("steps"), 10);
  EXPECT_EQ(r.plan.job.entry("steps").origin, Origin::File);
  EXPECT_EQ(r.plan.job.entry("steps").pos.line, 5);
  EXPECT_EQ(r.plan.job.get_int("seed"), 1234);
  EXPECT_EQ(r.plan.job.entry("seed").origin, Origin::Default);
  EXPECT_EQ(r.plan.model.get_int("width"), 16);
  EXPECT_EQ(r.plan.model.get_int("heads"), 2);
  EXPECT_DOUBLE_EQ(r.plan.optimizer.get_float("lr"), 1e-3);
  EXPECT_DOUBLE_EQ(r.plan.optimizer.get_float("beta1"), 0.8);
  EXPECT_EQ(r.plan.optimizer.get_string("name"), "adamw");
  ASSERT_EQ(r.plan.passes.size(), 2u);
  EXPECT_EQ(r.plan.passes[0].pass->name(), "alpha");
  EXPECT_EQ(r.plan.passes[0].config.get_string("dtype"), "fp16");
  EXPECT_TRUE(r.plan.passes[0].enabled);
  EXPECT_FALSE(r.plan.passes[1].enabled);
  EXPECT_EQ(r.plan.layout.mesh.data, 1);
}

TEST(Strategy, TomlSyntaxErrorHasPosition) {
  Result r = resolve_text("[job]\nmodel = \"tiny\"\nsteps = = 3\n");
  ASSERT_FALSE(r.diagnostics.ok());
  EXPECT_EQ(r.diagnostics.items()[0].pos.line, 3);
  EXPECT_NE(errors(r).find("s.toml:3:"), std::string::npos) << errors(r);
  EXPECT_NE(errors(r).find("invalid TOML"), std::string::npos);
}

TEST(Strategy, UnknownKeyNamesPositionAndSuggestion) {
  std::string text = kGood;
  text.replace(text.find("steps = 10"), 10, "stesp = 10");
  Result r = resolve_text(text);
  ASSERT_EQ(r.diagnostics.items().size(), 1u) << errors(r);
  EXPECT_EQ(errors(r), "s.toml:5:1: error: unknown key 'stesp' for [job]; did you mean 'steps'?\n");
}

TEST(Strategy, WrongTypeAndRangeAreReportedTogether) {
  std::string text = kGood;
  text.replace(text.find("steps = 10"), 10, "steps = \"ten\"");
  text.replace(text.find("width = 16"), 10, "width = 0");
  Result r = resolve_text(text);
  std::string e = errors(r);
  ASSERT_EQ(r.diagnostics.items().size(), 2u) << e;
  EXPECT_NE(e.find("s.toml:5:1: error: key 'steps' of [job] expects integer, got string \"ten\""), std::string::npos) << e;
  EXPECT_NE(e.find("s.toml:8:1: error: key 'width' of model 'tiny' in [model] must be >= 1, got 0"), std::string::npos) << e;
}

TEST(Strategy, ChoicesAreEnforced) {
  std::string text = kGood;
  text.replace(text.find("dtype = \"fp16\""), 14, "dtype = \"fp8\"");
  Result r = resolve_text(text);
  EXPECT_NE(errors(r).find("s.toml:19:1: error: key 'dtype' of pass 'alpha' does not accept \"fp8\"; choose from [\"bf16\", \"fp16\"]"),
            std::string::npos)
      << errors(r);
}

TEST(Strategy, MissingRequiredKeyPointsAtSection) {
  std::string text = kGood;
  text.replace(text.find("path = \"corpus.txt\""), 19, "");
  Result r = resolve_text(text);
  EXPECT_NE(errors(r).find("s.toml:10:1: error: dataset 'toy' in [data] needs key 'path'"), std::string::npos) << errors(r);
}

TEST(Strategy, UnknownSectionTopLevelKeyAndPass) {
  std::string text = std::string("oops = 1\n") + kGood + "\n[modle]\nx = 1\n\n[[pass]]\nname = \"alpah\"\n";
  Result r = resolve_text(text);
  std::string e = errors(r);
  EXPECT_NE(e.find("s.toml:1:1: error: unknown top-level key 'oops'"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown section [modle]"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown pass 'alpah'; did you mean 'alpha'?"), std::string::npos) << e;
}

TEST(Strategy, UnknownComponentListsRegisteredOnes) {
  std::string text = kGood;
  text.replace(text.find("model = \"tiny\""), 14, "model = \"tinny\"");
  Result r = resolve_text(text);
  EXPECT_NE(errors(r).find("s.toml:3:1: error: unknown model 'tinny' in [job] model; did you mean 'tiny'? (registered: tiny)"),
            std::string::npos)
      << errors(r);
}

TEST(Strategy, ComponentCrossKeyValidationRuns) {
  std::string text = kGood;
  text.replace(text.find("width = 16"), 10, "width = 15");
  Result r = resolve_text(text);
  EXPECT_NE(errors(r).find("width must divide by heads"), std::string::npos) << errors(r);
}

TEST(Strategy, DuplicatePassIsAnError) {
  Result r = resolve_text(std::string(kGood) + "\n[[pass]]\nname = \"alpha\"\n");
  EXPECT_NE(errors(r).find("pass 'alpha' appears twice (first at s.toml:17:1)"), std::string::npos) << errors(r);
}

TEST(Strategy, SetOverridesWithTypes) {
  Result r = resolve_text(kGood, {"job.steps=42", "model.width=32", "optimizer.lr=0.5", "job.run_dir=/tmp/x",
                                  "pass.alpha.dtype=bf16", "pass.beta.wrap=[\"a\", \"b\"]"});
  ASSERT_TRUE(r.diagnostics.ok()) << errors(r);
  EXPECT_EQ(r.plan.job.get_int("steps"), 42);
  EXPECT_EQ(r.plan.job.entry("steps").origin, Origin::CommandLine);
  EXPECT_EQ(r.plan.model.get_int("width"), 32);
  EXPECT_DOUBLE_EQ(r.plan.optimizer.get_float("lr"), 0.5);
  EXPECT_EQ(r.plan.job.get_string("run_dir"), "/tmp/x");
  EXPECT_EQ(r.plan.passes[0].config.get_string("dtype"), "bf16");
  EXPECT_EQ(r.plan.passes[1].config.get_strings("wrap"), (StringList{"a", "b"}));
}

TEST(Strategy, SetErrorsNameTheOverride) {
  Result r = resolve_text(kGood, {"job.steps=abc", "nosuch.key=1", "pass.zeta.x=1", "novalue"});
  std::string e = errors(r);
  EXPECT_NE(e.find("--set job.steps=abc: error: key 'steps' of [job] expects integer, got string \"abc\""), std::string::npos) << e;
  EXPECT_NE(e.find("--set nosuch.key=1: error: unknown section 'nosuch'"), std::string::npos) << e;
  EXPECT_NE(e.find("--set pass.zeta.x=1: error: the strategy has no [[pass]] named 'zeta'"), std::string::npos) << e;
  EXPECT_NE(e.find("--set novalue: error: expected section.key=value"), std::string::npos) << e;
}

TEST(Strategy, DisableSwitchesPassOff) {
  Result r = resolve_text(kGood, {}, {"alpha"});
  ASSERT_TRUE(r.diagnostics.ok()) << errors(r);
  EXPECT_FALSE(r.plan.passes[0].enabled);
  Result both = resolve_text(kGood, {"pass.beta.enabled=true"}, {});
  ASSERT_TRUE(both.diagnostics.ok()) << errors(both);
  EXPECT_TRUE(both.plan.passes[1].enabled);
  Result missing = resolve_text(kGood, {}, {"zeta"});
  EXPECT_NE(errors(missing).find("--disable zeta: error: the strategy has no [[pass]] named 'zeta'"), std::string::npos);
}

TEST(Strategy, ParallelAutoFillsWorldSize) {
  Result r = resolve_text(std::string(kGood) + "\n[parallel]\ntensor = 2\n", {}, {}, 8);
  ASSERT_TRUE(r.diagnostics.ok()) << errors(r);
  EXPECT_EQ(r.plan.layout.mesh.data, 4);
  EXPECT_EQ(r.plan.layout.mesh.tensor, 2);
  Result bad = resolve_text(std::string(kGood) + "\n[parallel]\ntensor = 3\n", {}, {}, 8);
  EXPECT_NE(errors(bad).find("s.toml:25:1: error: [parallel] tensor 3 x pipeline 1 x context 1 = 3 does not divide the world size 8"),
            std::string::npos)
      << errors(bad);
  Result fixed = resolve_text(std::string(kGood) + "\n[parallel]\ndata = 2\n", {}, {}, 8);
  EXPECT_NE(errors(fixed).find("[parallel] data 2 x tensor 1 x pipeline 1 x context 1 = 2 ranks, but the world size is 8"),
            std::string::npos)
      << errors(fixed);
  Result order = resolve_text(std::string(kGood) + "\n[parallel]\norder = [\"data\", \"data\", \"tensor\", \"pipeline\"]\n");
  EXPECT_NE(errors(order).find("order must name tensor, context, pipeline and data once each"), std::string::npos)
      << errors(order);
}

TEST(Strategy, IntegerWidensToFloatButNotTheOtherWay) {
  Result r = resolve_text(kGood, {"optimizer.lr=1", "job.steps=1.5"});
  EXPECT_EQ(r.diagnostics.items().size(), 1u) << errors(r);
  EXPECT_NE(errors(r).find("key 'steps' of [job] expects integer, got number 1.5"), std::string::npos) << errors(r);
}

// A model whose description file (here: a fixed one, "desc.json") gives heads = width / 4 where
// width is set, and depth = heads + 1 where heads is not at its default: the second follows from
// the first, so it needs a second round. It always names itself (label), a change in round one.
class DescribedModel final : public ModelFactory, public DerivesDefaults {
 public:
  DescribedModel()
      : ModelFactory({ComponentKind::Model, "described", "described model",
                      Schema().integer("width", 8, "width", at_least(1)).integer("heads", 2, "heads", at_least(1)).integer("depth", 1, "depth", at_least(1)).string("label", "", "label")}) {}
  std::vector<Derived> derived_defaults(const Config& c) const override {
    std::vector<Derived> out;
    const SourcePos from{"desc.json", 0, 0};
    if (c.entry("width").origin != Origin::Default) out.push_back({"heads", Value{c.get_int("width") / 4}, from});
    if (c.entry("heads").origin != Origin::Default) out.push_back({"depth", Value{c.get_int("heads") + 1}, from});
    out.push_back({"label", Value{std::string("described")}, from});
    return out;
  }
  std::shared_ptr<nn::Model> create(const Config&) const override { return nullptr; }
};

Result resolve_described(const std::string& model_keys) {
  static auto registry = [] {
    auto r = test::make_test_registry();
    r->register_plugin(PluginRecord{"described", "0", "<test>", "", {}}, [](Registry& reg) { reg.add(std::make_unique<DescribedModel>()); });
    return r;
  }();
  Result r;
  RawStrategy raw = parse_strategy_text("[job]\nmodel = \"described\"\ndataset = \"toy\"\n[model]\n" + model_keys + "\n[data]\npath = \"x\"\n", "s.toml", r.diagnostics);
  r.plan = resolve_strategy(raw, *registry, 1, r.diagnostics);
  return r;
}

TEST(Strategy, DerivedDefaultsFillUnsetKeysUntilNothingChanges) {
  Result r = resolve_described("width = 16");
  ASSERT_TRUE(r.diagnostics.ok()) << errors(r);
  EXPECT_EQ(r.plan.model.get_int("heads"), 4);
  EXPECT_EQ(r.plan.model.entry("heads").origin, Origin::File);
  EXPECT_EQ(r.plan.model.entry("heads").pos.file, "desc.json");
  EXPECT_EQ(r.plan.model.get_int("depth"), 5);  // from the filled heads, in the second round
  EXPECT_EQ(r.plan.model.entry("depth").pos.file, "desc.json");
}

TEST(Strategy, DerivedDefaultsNeverReplaceAStatedKey) {
  Result r = resolve_described("width = 16\nheads = 2\ndepth = 7");
  ASSERT_TRUE(r.diagnostics.ok()) << errors(r);
  EXPECT_EQ(r.plan.model.get_int("heads"), 2);
  EXPECT_EQ(r.plan.model.entry("heads").pos.line, 6);
  EXPECT_EQ(r.plan.model.get_int("depth"), 7);
  // Nothing derived, nothing filled: the defaults stay defaults.
  Result d = resolve_described("");
  ASSERT_TRUE(d.diagnostics.ok()) << errors(d);
  EXPECT_EQ(d.plan.model.entry("heads").origin, Origin::Default);
}

TEST(Strategy, DerivedValueOutsideTheSchemaNamesItsSource) {
  Result r = resolve_described("width = 2");  // once, though a second round (label changed) would derive it again
  EXPECT_EQ(errors(r), "desc.json: error: key 'heads' of model 'described' in [model], taken from here, must be >= 1, got 0\n");
}

TEST(Strategy, PluginPathIsRelativeToTheStrategyFile) {
  Diagnostics d;
  RawStrategy raw = parse_strategy_text("[job]\nplugin_path = [\"plugins\", \"/abs\"]\n", "conf/s.toml", d);
  auto paths = strategy_plugin_path(raw);
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0], std::filesystem::path("conf/plugins"));
  EXPECT_EQ(paths[1], std::filesystem::path("/abs"));
}

}  // namespace
}  // namespace strata
