// The Trainer (strata/core/trainer.h) driven a step at a time, as the library API drives it: the
// same losses as `strata run`'s run(), and save()/load() continuing a run exactly; the sampling
// loop's window.
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

// Logits whose argmax is the number of tokens the model was given (mod the vocabulary): greedy
// sampling then writes down the window it reads.
class CountsTheWindow final : public nn::Block {
 public:
  explicit CountsTheWindow(int64_t vocab) : Block("counter"), vocab_(vocab) {}
  at::Tensor forward(const at::Tensor& tokens) override {
    const int64_t t = tokens.size(1);
    return at::one_hot(at::full({tokens.size(0), t}, t % vocab_, at::kLong), vocab_).to(at::kFloat);
  }

 private:
  int64_t vocab_;
};

std::vector<int64_t> greedy_ids(int64_t max_positions) {
  CheckpointModel loaded;
  loaded.model = std::make_shared<nn::Model>(/*vocab_size=*/16, /*seq_len=*/4);
  loaded.model->add_block("counter", std::make_shared<CountsTheWindow>(16));
  loaded.plan.model.set("max_positions", Config::Entry{Value{max_positions}, Origin::File, {}});
  SampleOptions greedy;
  greedy.tokens = 8, greedy.temperature = 0;
  return continue_tokens(loaded, {0}, greedy);
}

TEST(Sample, ReadsTheContextTheModelIsMadeFor) {
  // [model] max_positions 6 (GPT's learned rows, what the export states): windows up to 6 tokens.
  EXPECT_EQ(greedy_ids(6), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 6, 6}));
  // 0: seq_len, 4.
  EXPECT_EQ(greedy_ids(0), (std::vector<int64_t>{0, 1, 2, 3, 4, 4, 4, 4, 4}));
}

TEST(Sample, InvalidUtf8BecomesOneReplacementPerMaximalSubpart) {
  // Expected: Python's bytes.decode("utf-8", "replace") of the same bytes.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_or_replacement("ab \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80x"), "ab \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80x");
  EXPECT_EQ(utf8_or_replacement("\xC3"), r);                  // a character cut short at the end
  EXPECT_EQ(utf8_or_replacement("\xE2\x82"), r);
  EXPECT_EQ(utf8_or_replacement("\xF0\x9F\x98"), r);
  EXPECT_EQ(utf8_or_replacement("a\x80" "b"), "a" + r + "b");  // a stray continuation byte
  EXPECT_EQ(utf8_or_replacement("\xFF\xFE"), r + r);
  EXPECT_EQ(utf8_or_replacement("\xC0\xAF"), r + r);           // overlong
  EXPECT_EQ(utf8_or_replacement("\xE0\x80\xAF"), r + r + r);
  EXPECT_EQ(utf8_or_replacement("\xED\xA0\x80"), r + r + r);  // a surrogate
  EXPECT_EQ(utf8_or_replacement("\xF4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
  EXPECT_EQ(utf8_or_replacement("\xE2\x82x"), r + "x");
}

}  // namespace
}  // namespace strata
