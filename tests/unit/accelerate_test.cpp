// The library API (strata/accelerate.h): a model the program defines itself, trained through the
// Trainer `strata run` runs, with the program's loss; the same losses as `strata run` for the same
// strategy; refusals come back in the status.
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "strata/accelerate.h"
#include "strata/ops.h"
#include "strata/testing.h"
#include "tiny_strategies.h"
#include "../../sdk/examples/mlp_lm/mlp_lm_model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using mlp_lm::MlpLanguageModel;

using test::kTinyGpt;
using test::kTinyJob;

AccelerateOptions in(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_SCRATCH_DIR) / name;
  fs::remove_all(dir);
  return AccelerateOptions{RunOptions{dir}, {}};
}

TEST(Accelerate, SameLossesAsStrataRunForTheSameStrategy) {
  const RunSummary run = testing::train(kTinyGpt, in("accelerate_run").run.out_dir, {}, test::kTinyGptModel);
  Accelerated api = accelerate(nullptr, {}, nullptr, {}, Strategy::from_toml(kTinyGpt).set("job.model=gpt"), in("accelerate_api"));
  ASSERT_TRUE(api.ok) << api.status;
  const RunSummary summary = api.trainer->run();
  EXPECT_EQ(summary.last_step, 3);
  EXPECT_EQ(summary.last_loss, run.last_loss);  // bit for bit: one step program
}

TEST(Accelerate, TrainsTheProgramsOwnModelWithItsLoss) {
  Accelerated core = accelerate(std::make_unique<MlpLanguageModel>(), {"adamw", {"lr=1e-2"}}, nullptr, {},
                                Strategy::from_toml(kTinyJob).set("model.layers=3"), in("accelerate_own_model"));
  ASSERT_TRUE(core.ok) << core.status;
  EXPECT_NE(core.strategy.find("model = \"mlp_lm\""), std::string::npos) << core.strategy;
  EXPECT_NE(core.strategy.find("layers = 3"), std::string::npos);
  const double core_first = core.trainer->step().loss;
  const RunSummary rest = core.trainer->run();
  EXPECT_EQ(rest.last_step, 3);
  EXPECT_TRUE(std::isfinite(rest.last_loss));
  core = {};
  // The program's loss replaces core's: twice the cross entropy reports twice the first loss.
  auto doubled = [](const at::Tensor& logits, const at::Tensor& targets) {
    return 2 * ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1));
  };
  Accelerated own = accelerate(std::make_unique<MlpLanguageModel>(), {"adamw", {"lr=1e-2"}}, nullptr, doubled,
                               Strategy::from_toml(kTinyJob).set("model.layers=3"), in("accelerate_own_loss"));
  ASSERT_TRUE(own.ok) << own.status;
  EXPECT_EQ(own.trainer->step().loss, 2 * core_first);
}

// The text with `part` taken out.
std::string without(std::string text, const std::string& part) {
  const auto at = text.find(part);
  if (at != std::string::npos) text.erase(at, part.size());
  return text;
}

TEST(Accelerate, TensorDatasetTrainsAsTheSameTokensFromAFactory) {
  // The synthetic dataset's token streams, handed over as tensors the program holds.
  auto registry = testing::load_plugins({});
  const auto& synthetic = testing::component<DatasetFactory>(*registry, ComponentKind::Dataset, "synthetic");
  const auto stream = synthetic.open(testing::config_for(synthetic, {{"vocab_size", Value(int64_t{32})}}), {});
  auto tokens = [&](Split split) {
    at::Tensor out = at::empty({stream->num_tokens(split)}, at::kLong);
    stream->read(split, 0, out.numel(), out.data_ptr<int64_t>());
    return out;
  };
  const RunSummary run = testing::train(kTinyGpt, in("accelerate_tokens_run").run.out_dir, {}, test::kTinyGptModel);
  const std::string no_data = without(without(kTinyGpt, "dataset = \"synthetic\"\n"), "[data]\nvocab_size = 32\n");
  Accelerated api = accelerate(nullptr, {}, tensor_dataset("program_tokens", 32, tokens(Split::Train), tokens(Split::Val)), {},
                               Strategy::from_toml(no_data).set("job.model=gpt"), in("accelerate_tokens_api"));
  ASSERT_TRUE(api.ok) << api.status;
  EXPECT_EQ(api.trainer->run().last_loss, run.last_loss);
  EXPECT_EQ(api.trainer->metrics().step, 3);
  // Tokens outside the vocabulary are refused when the dataset is made.
  EXPECT_THROW(tensor_dataset("bad", 4, at::arange(10), at::arange(4)), UserError);
}

// The same windows handed over sample by sample (a map-style dataset): the same losses (the
// sampler addresses, shuffles and batches samples by index as it does windows of a stream).
// Both splits of the bundled synthetic dataset (vocabulary 32) as token streams.
std::map<Split, at::Tensor> synthetic_tokens() {
  auto registry = testing::load_plugins({});
  const auto& synthetic = testing::component<DatasetFactory>(*registry, ComponentKind::Dataset, "synthetic");
  const auto source = synthetic.open(testing::config_for(synthetic, {{"vocab_size", Value(int64_t{32})}}), {});
  std::map<Split, at::Tensor> tokens;
  for (Split split : {Split::Train, Split::Val}) {
    tokens[split] = at::empty({source->num_tokens(split)}, at::kLong);
    source->read(split, 0, tokens[split].numel(), tokens[split].data_ptr<int64_t>());
  }
  return tokens;
}

TEST(Accelerate, SampleDatasetTrainsAsTheSameWindows) {
  std::map<Split, at::Tensor> tokens = synthetic_tokens();
  const int64_t seq_len = 8;  // kTinyGpt's
  auto windows = [&](Split split) { return (tokens[split].numel() - 1) / seq_len; };
  auto sample = [tokens, seq_len](Split split, int64_t i) { return tokens.at(split).narrow(0, i * seq_len, seq_len + 1).to(at::kInt); };
  const std::string no_data = without(without(kTinyGpt, "dataset = \"synthetic\"\n"), "[data]\nvocab_size = 32\n");
  const RunSummary run = testing::train(kTinyGpt, in("accelerate_samples_run").run.out_dir, {}, test::kTinyGptModel);
  AccelerateOptions options = in("accelerate_samples_api");
  {
    Accelerated api = accelerate(nullptr, {}, sample_dataset("program_samples", 32, seq_len, windows(Split::Train), windows(Split::Val), sample),
                                 {}, Strategy::from_toml(no_data).set("job.model=gpt"), options);
    ASSERT_TRUE(api.ok) << api.status;
    EXPECT_EQ(api.trainer->run().last_loss, run.last_loss);
  }
  // A job of another seq_len is refused naming the dataset's.
  Accelerated other = accelerate(nullptr, {}, sample_dataset("program_samples", 32, seq_len, windows(Split::Train), windows(Split::Val), sample),
                                 {}, Strategy::from_toml(no_data).set("job.model=gpt").set("model.seq_len=4"), in("accelerate_samples_bad"));
  ASSERT_TRUE(other.ok) << other.status;
  try {
    other.trainer->step();
    ADD_FAILURE() << "a seq_len 4 job read samples of 8";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("set [model] seq_len = 8"), std::string::npos) << e.what();
  }
}

// The same windows as a stream (iterable-style): read in order, started again for earlier ones,
// they train to the bundled dataset's losses bit for bit, evaluation included, and a run resumed
// halfway continues exactly; shuffling it is refused.
TEST(Accelerate, StreamDatasetTrainsInOrderAndResumesExactly) {
  std::map<Split, at::Tensor> tokens = synthetic_tokens();
  const int64_t seq_len = 8;  // kTinyGpt's
  auto windows = [&](Split split) { return (tokens[split].numel() - 1) / seq_len; };
  auto open = [tokens, seq_len](Split split) {
    auto next = std::make_shared<int64_t>(0);
    const at::Tensor all = tokens.at(split);
    return std::function<at::Tensor()>([all, seq_len, next]() -> at::Tensor {
      if ((*next + 1) * seq_len >= all.numel()) return at::Tensor();  // the stream ends
      return all.narrow(0, (*next)++ * seq_len, seq_len + 1);
    });
  };
  const std::string no_data = without(without(kTinyGpt, "dataset = \"synthetic\"\n"), "[data]\nvocab_size = 32\n");
  const StringList sets{"job.model=gpt", "job.shuffle=false", "job.steps=6", "job.eval_every=2"};
  auto strategy = [&](const std::string& text) {
    Strategy out = Strategy::from_toml(text);
    for (const auto& s : sets) out.set(s);
    return out;
  };
  auto stream = [&] { return stream_dataset("program_stream", 32, seq_len, windows(Split::Train), windows(Split::Val), open); };
  std::vector<StepRecord> reference;
  {
    Accelerated bundled = accelerate(nullptr, {}, nullptr, {}, strategy(kTinyGpt), in("accelerate_stream_reference"));
    ASSERT_TRUE(bundled.ok) << bundled.status;
    for (int s = 0; s < 6; ++s) reference.push_back(bundled.trainer->step());
  }
  {
    Accelerated api = accelerate(nullptr, {}, stream(), {}, strategy(no_data), in("accelerate_stream"));
    ASSERT_TRUE(api.ok) << api.status;
    for (int s = 0; s < 6; ++s) {
      const StepRecord& r = api.trainer->step();
      EXPECT_EQ(r.loss, reference[static_cast<size_t>(s)].loss) << s;
      EXPECT_EQ(r.val_loss, reference[static_cast<size_t>(s)].val_loss) << s;
    }
  }
  AccelerateOptions cut = in("accelerate_stream_cut");
  {
    Accelerated first = accelerate(nullptr, {}, stream(), {}, strategy(no_data), cut);
    ASSERT_TRUE(first.ok) << first.status;
    for (int s = 0; s < 3; ++s) first.trainer->step();
    first.trainer->save();
  }
  cut.run.resume = true;
  Accelerated resumed = accelerate(nullptr, {}, stream(), {}, strategy(no_data), cut);
  ASSERT_TRUE(resumed.ok) << resumed.status;
  ASSERT_EQ(resumed.trainer->completed_steps(), 3);
  for (int s = 3; s < 6; ++s) EXPECT_EQ(resumed.trainer->step().loss, reference[static_cast<size_t>(s)].loss) << s;
  resumed = {};
  Accelerated shuffled = accelerate(nullptr, {}, stream(), {}, strategy(no_data).set("job.shuffle=true"), in("accelerate_stream_shuffled"));
  EXPECT_FALSE(shuffled.ok);
  EXPECT_NE(shuffled.status.find("stream read in order"), std::string::npos) << shuffled.status;
}

TEST(Accelerate, ProblemsComeBackInTheStatus) {
  // A strategy naming another model than the program's.
  Accelerated named = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::from_toml(kTinyGpt).set("job.model=gpt"),
                                 in("accelerate_named"));
  EXPECT_FALSE(named.ok);
  EXPECT_NE(named.status.find("model = \"gpt\" but accelerate() was given \"mlp_lm\""), std::string::npos) << named.status;
  // A key the program's model does not declare: refused by plan, as strata plan refuses it.
  Accelerated unknown = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::from_toml(kTinyJob).set("model.depth=3"),
                                   in("accelerate_unknown_key"));
  EXPECT_FALSE(unknown.ok);
  EXPECT_NE(unknown.status.find("depth"), std::string::npos) << unknown.status;
  // A pass that replaces the loss cannot serve the program's.
  auto loss = [](const at::Tensor& logits, const at::Tensor& targets) {
    return ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1));
  };
  Accelerated fused = accelerate(nullptr, {}, nullptr, loss, Strategy::from_toml(kTinyGpt + "[[pass]]\nname = \"fused_loss\"\n").set("job.model=gpt"),
                                 in("accelerate_fused_loss"));
  EXPECT_FALSE(fused.ok);
  EXPECT_NE(fused.status.find("pass fused_loss replaces the loss"), std::string::npos) << fused.status;
  EXPECT_FALSE(fused.trainer);
}

TEST(Accelerate, NotesAKeyNothingReads) {
  // Evaluation stated off with its size stated: planned, and the size named as unread.
  ::testing::internal::CaptureStderr();
  Accelerated noted = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {},
                                 Strategy::from_toml(kTinyJob).set("job.eval_every=0").set("job.eval_batches=2"), in("accelerate_noted"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(noted.ok) << noted.status;
  EXPECT_NE(err.find("strata: note: [job] eval_batches = 2 is not read: eval_every = 0 runs no evaluation\n"), std::string::npos) << err;
}

TEST(Accelerate, OneTrainerPerProcessAtATime) {
  Accelerated first = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::from_toml(kTinyJob), in("accelerate_first"));
  ASSERT_TRUE(first.ok) << first.status;
  Accelerated second = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::from_toml(kTinyJob), in("accelerate_second"));
  EXPECT_FALSE(second.ok);
  EXPECT_NE(second.status.find("another Trainer is alive in this process"), std::string::npos) << second.status;
  first = {};
  Accelerated third = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::from_toml(kTinyJob), in("accelerate_third"));
  EXPECT_TRUE(third.ok) << third.status;
}

TEST(Accelerate, AutomaticPicksAStrategyThatPlansAndSaysSo) {
  Accelerated automatic = accelerate(std::make_unique<MlpLanguageModel>(), {"adamw", {}}, nullptr, {},
                                     Strategy::automatic(1, kTinyJob, 0, /*trials=*/1), in("accelerate_automatic"));
  ASSERT_TRUE(automatic.ok) << automatic.status;
  EXPECT_NE(automatic.status.find("automatic strategy"), std::string::npos) << automatic.status;
  EXPECT_NE(automatic.status.find("not measured"), std::string::npos);
  EXPECT_EQ(automatic.trainer->run().last_step, 3);
  Accelerated mismatch = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::automatic(4, kTinyJob),
                                    in("accelerate_automatic_4"));
  EXPECT_FALSE(mismatch.ok);
  EXPECT_NE(mismatch.status.find("Strategy::automatic(4) is for 4 ranks, but 1 started"), std::string::npos) << mismatch.status;
}

// Measured: the cost model's best three trained for a few steps each in this process, the fastest
// taken; the trials leave the run's own directory alone, and the chosen strategy then trains to
// the losses the same strategy gives on its own (the trials do not disturb the generators).
TEST(Accelerate, AutomaticMeasuresTheBestCandidatesAndTakesTheFastest) {
  const AccelerateOptions options = in("accelerate_measured");
  fs::remove_all(options.run.out_dir.string() + ".trials");
  Accelerated automatic =
      accelerate(std::make_unique<MlpLanguageModel>(), {"adamw", {}}, nullptr, {}, Strategy::automatic(1, kTinyJob), options);
  ASSERT_TRUE(automatic.ok) << automatic.status;
  EXPECT_NE(automatic.status.find("measured in this process"), std::string::npos) << automatic.status;
  EXPECT_EQ(automatic.status.find("not measured"), std::string::npos) << automatic.status;
  for (const char* trial : {"candidate_1", "candidate_2", "candidate_3"})
    EXPECT_TRUE(fs::exists(fs::path(options.run.out_dir.string() + ".trials") / trial / "metrics.jsonl")) << trial;
  std::vector<double> chosen;
  for (int s = 0; s < 3; ++s) chosen.push_back(automatic.trainer->step().loss);
  const std::string strategy = automatic.strategy;
  automatic = {};
  Accelerated again = accelerate(std::make_unique<MlpLanguageModel>(), {}, nullptr, {}, Strategy::from_toml(strategy), in("accelerate_measured_again"));
  ASSERT_TRUE(again.ok) << again.status;
  for (int s = 0; s < 3; ++s) EXPECT_EQ(again.trainer->step().loss, chosen[static_cast<size_t>(s)]) << s;
}

}  // namespace
}  // namespace strata
