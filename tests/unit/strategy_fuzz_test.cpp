// Hostile strategies never crash the planner: mutations of every example strategy (values of the
// wrong type or absurd size in real keys, unknown keys, damaged TOML text, odd world sizes) go
// through everything `strata plan` runs (parse, --set overrides, resolve, pass order, mesh
// claims, size checks) and must end in a plan or in errors for the user: no other exception, no
// signal. Bounded and seeded, so a failure reproduces; the failing case is printed.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "bundled_plugins.h"
#include "strata/core/pass_manager.h"
#include "strata/core/strategy.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> example_texts() {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(fs::path(STRATA_SOURCE_DIR) / "examples" / "strategies")) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    out.push_back(text.str());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Keys that code reads, so wrong values reach validation and the checks behind it.
const std::vector<std::string> kKeys = {
    "job.steps",           "job.global_batch",  "job.micro_batch",      "job.seed",          "job.threads",
    "job.device",          "job.model",         "job.dataset",          "job.checkpoint_every", "job.eval_every",
    "model.n_layer",       "model.n_head",      "model.d_model",        "model.vocab_size",  "model.seq_len",
    "model.dropout",       "model.n_kv_head",   "model.init_from",      "data.path",         "data.val_fraction",
    "optimizer.name",      "optimizer.lr",      "optimizer.grad_clip",  "optimizer.weight_decay",
    "optimizer.warmup_steps", "optimizer.schedule", "parallel.data",    "parallel.tensor",   "parallel.pipeline",
    "parallel.context",    "parallel.order",    "parallel.backend",     "pass.ddp.enabled",  "pass.ddp.bucket_mb",
    "pass.fsdp.min_params", "pass.amp.dtype",   "pass.zero2.enabled",   "job.nonexistent",   "pass.nosuch.key",
    "nosection.key",       "model",             "pass.ddp",             "job..steps"};

const std::vector<std::string> kValues = {
    "0", "-1", "1", "3", "2147483648", "9223372036854775807", "-9223372036854775808", "18446744073709551616",
    "inf", "-inf", "nan", "1e308", "1e-320", "-0.0", "0.5", "true", "false", "\"\"", "\"auto\"", "\"cuda:99\"",
    "\"gpt\"", "\"llama\"", "\"nope\"", "[]", "[1, \"a\"]", "[\"tensor\", \"data\"]", "{a = 1}", "\"" + std::string(300, 'x') + "\"",
    "\"/dev/zero\"", "\"data/../../../etc/passwd\"", "[[1]]", "1979-05-27T07:32:00Z"};

std::string mutate_text(std::string text, std::mt19937& rng) {
  if (text.empty()) return text;
  std::uniform_int_distribution<size_t> at(0, text.size() - 1);
  switch (rng() % 5) {
    case 0: return text.substr(0, at(rng));                                             // cut short
    case 1: text.insert(at(rng), 1, static_cast<char>(rng() % 256)); return text;      // a stray byte
    case 2: text.insert(at(rng), "\n[[pass]]\nname = \"ddp\"\n"); return text;            // a pass twice
    case 3: text.insert(at(rng), std::string(static_cast<size_t>(rng() % 200), '[')); return text;  // nesting
    default: {                                                                         // a line removed
      const size_t begin = text.rfind('\n', at(rng));
      const size_t end = text.find('\n', begin == std::string::npos ? 0 : begin + 1);
      return text.erase(begin == std::string::npos ? 0 : begin, end == std::string::npos ? std::string::npos : end - begin);
    }
  }
}

TEST(StrategyFuzz, MutatedStrategiesPlanOrFailCleanly) {
  const std::vector<std::string> examples = example_texts();
  ASSERT_FALSE(examples.empty());
  const std::string kjv = (fs::path(STRATA_SOURCE_DIR) / "data" / "kjv.txt").string();
  const std::vector<int64_t> world_sizes = {1, 2, 3, 4, 7, 64};
  std::mt19937 rng(21);
  int planned = 0, refused = 0;
  for (int c = 0; c < 3000; ++c) {
    std::string text = examples[rng() % examples.size()];
    if (rng() % 4 == 0) text = mutate_text(text, rng);
    StringList sets{"data.path=\"" + kjv + "\""};
    for (int n = static_cast<int>(rng() % 4); n > 0; --n) sets.push_back(kKeys[rng() % kKeys.size()] + "=" + kValues[rng() % kValues.size()]);
    const int64_t world = world_sizes[rng() % world_sizes.size()];
    std::string described = "case " + std::to_string(c) + " at " + std::to_string(world) + " ranks, sets:";
    for (const auto& s : sets) described += " " + s.substr(0, 60);
    try {
      Diagnostics diagnostics;
      RawStrategy raw = parse_strategy_text(text, "fuzz.toml", diagnostics);
      if (diagnostics.ok()) apply_overrides(raw, sets, {}, diagnostics);
      if (diagnostics.ok()) {
        ResolvedStrategy plan = resolve_strategy(raw, test::bundled(), world, diagnostics);
        order_passes(plan.passes, diagnostics);
        check_claims(plan, test::bundled(), diagnostics);
        const bool resolved = diagnostics.ok();
        check_sizes(plan, diagnostics);
        if (resolved) check_data(plan, diagnostics);
      }
      (diagnostics.ok() ? planned : refused) += 1;
      if (!diagnostics.ok()) EXPECT_EQ(diagnostics.str().find("internal error"), std::string::npos) << described;
    } catch (const UserError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << described << ": " << typeid(e).name() << ": " << e.what() << "\n--- strategy ---\n" << text;
    }
  }
  // The mix must exercise both outcomes, or the fuzzing proves little.
  EXPECT_GT(planned, 100);
  EXPECT_GT(refused, 500);
  std::cout << planned << " planned, " << refused << " refused\n";
}

}  // namespace
}  // namespace strata
