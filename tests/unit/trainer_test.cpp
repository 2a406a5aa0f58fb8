// The Trainer (strata/core/trainer.h) driven a step at a time, as the library API drives it: the
// same losses as `strata run`'s run(), and save()/load() continuing a run exactly.
#include <filesystem>

#include <gtest/gtest.h>

#include "strata/core/trainer.h"
#include "strata/testing.h"
#include "tiny_strategies.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The tiny GPT for 6 steps of 2 micro-batches.
StringList settings(StringList more = {}) {
  StringList out = test::kTinyGptModel;
  out.insert(out.end(), {"job.steps=6", "job.micro_batch=2"});
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_SCRATCH_DIR) / name;
  fs::remove_all(dir);
  return dir;
}

TEST(Trainer, StepByStepIsWhatRunRuns) {
  const auto planned = testing::plan_strategy(test::kTinyGpt, {}, settings());
  const RunSummary whole = run_training(planned.plan, planned.order, *planned.registry, {fresh_dir("trainer_run"), false});
  Trainer trainer(planned.plan, planned.order, *planned.registry, {fresh_dir("trainer_steps"), false});
  double loss = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    const StepRecord& record = trainer.step();
    EXPECT_EQ(record.step, step);
    loss = record.loss;
  }
  EXPECT_EQ(trainer.completed_steps(), 6);
  EXPECT_EQ(loss, whole.last_loss);  // bit-identical: one step program
}

TEST(Trainer, SaveThenLoadContinuesExactly) {
  const auto planned = testing::plan_strategy(test::kTinyGpt, {}, settings());
  const fs::path dir = fresh_dir("trainer_save_load");
  std::vector<double> after_save;
  {
    Trainer trainer(planned.plan, planned.order, *planned.registry, {dir, false});
    trainer.step();
    trainer.step();
    trainer.save();
    for (int i = 0; i < 2; ++i) after_save.push_back(trainer.step().loss);
  }
  Trainer resumed(planned.plan, planned.order, *planned.registry, {dir, /*resume=*/true});
  EXPECT_EQ(resumed.completed_steps(), 2);
  for (double loss : after_save) EXPECT_EQ(resumed.step().loss, loss);
  // load() mid-run goes back to the checkpoint, and the steps after it repeat exactly.
  EXPECT_TRUE(resumed.load());
  EXPECT_EQ(resumed.completed_steps(), 2);
  EXPECT_EQ(resumed.step().loss, after_save[0]);
}

TEST(Trainer, RefusesToStepPastTheSchedule) {
  const auto planned = testing::plan_strategy(test::kTinyGpt, {}, settings({"job.steps=1"}));
  Trainer trainer(planned.plan, planned.order, *planned.registry, {fresh_dir("trainer_past_end"), false});
  trainer.step();
  EXPECT_THROW(trainer.step(), UserError);
  EXPECT_EQ(trainer.completed_steps(), 1);
}

}  // namespace
}  // namespace strata
