// The fp8 pass: selected Linear layers compute in float8 (docs/fp8.md). Each one gets a compute
// hook (nn::LayerHooks::compute) running its output, input-gradient and weight-gradient GEMMs
// through at::_scaled_mm on fp8 operands; tensor parallel's on_input/on_weight/on_output hooks
// still run around it, so the hook sees this rank's local weight (gathered first under fsdp).
// Scaling is Transformer Engine's delayed recipe (scales from the amax history of previous
// steps, job state so a resumed run continues exactly), the current (dynamic tensorwise) one, or
// rowwise (dynamic, a scale per row or column along each GEMM's contracted dimension).
#include <iostream>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/modules/linear.h>

#include "fp8_layers.h"
#include "fp8_linear.h"
#include "fp8_rowwise.h"
#include "strata/plugin.h"
#include "strata/rng.h"

namespace strata::fp8 {
namespace {

// The delayed-scaling state, checkpointed as fp8/amax_history, fp8/scale, fp8/pending_amax and
// fp8/scales_updated.
class State final : public Stateful {
 public:
  State(std::shared_ptr<DelayedScaling> scaling, bool reduced) : scaling_(std::move(scaling)), reduced_(reduced) {}

  NamedTensors save() const override {
    return {{"amax_history", scaling_->history.clone()},
            {"scale", scaling_->scale.clone()},
            {"pending_amax", scaling_->pending.clone()},
            {"scales_updated", at::full({1}, scaling_->updated ? 1.0f : 0.0f)}};
  }

  void load(const NamedTensors& tensors) override {
    std::optional<bool> updated;
    for (const auto& [name, t] : tensors) {
      if (name == "scales_updated") {
        updated = t.item<float>() != 0;
        continue;
      }
      if (name != "amax_history" && name != "scale" && name != "pending_amax")
        throw UserError("checkpoint state fp8/" + name + " is not fp8 state");
      at::Tensor& mine = name == "amax_history" ? scaling_->history : name == "scale" ? scaling_->scale : scaling_->pending;
      if (t.sizes() != mine.sizes())
        throw UserError("checkpoint state fp8/" + name + " has shape " + shape(t) + " but this job's fp8 layers and amax_history_len need " +
                        shape(mine));
      at::NoGradGuard no_grad;
      mine.copy_(t);
    }
    // Checkpoints from before scales_updated existed: the scales were updated once the history
    // holds an amax.
    scaling_->updated = updated.value_or(scaling_->history.ne(0).any().item<bool>());
  }

  // With reduce_amax every data (and tensor) rank records the same amaxes, so holds the same state.
  bool same_on_data_ranks() const override { return reduced_; }

 private:
  static std::string shape(const at::Tensor& t) {
    std::string out;
    for (int64_t d : t.sizes()) out += (out.empty() ? "[" : ", ") + std::to_string(d);
    return out + "]";
  }
  std::shared_ptr<DelayedScaling> scaling_;
  bool reduced_;
};

// Turns a device's autocast off for its lifetime: the layer casts explicitly.
class NoAutocast {
 public:
  explicit NoAutocast(c10::DeviceType device) : device_(device), enabled_(at::autocast::is_autocast_enabled(device)) {
    at::autocast::set_autocast_enabled(device_, false);
  }
  ~NoAutocast() { at::autocast::set_autocast_enabled(device_, enabled_); }
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
};

// Runs an fp8 layer's computation, given the dtype its output must have: under autocast, what the
// high-precision linear it replaces would return (the autocast dtype). The layer's own casts are
// explicit, so autocast is off inside.
template <typename Compute>
at::Tensor without_autocast(const at::Tensor& x, const Compute& compute) {
  const c10::DeviceType device = x.device().type();
  const at::ScalarType out_dtype = at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : x.scalar_type();
  const NoAutocast off(device);
  return compute(out_dtype);
}

// Keys only the delayed recipe reads: refused when set under another recipe.
const char* const kDelayedOnly[] = {"interval", "amax_history_len", "amax_compute_algo"};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

class Fp8Pass final : public Pass {
 public:
  Fp8Pass()
      : Pass({ComponentKind::Pass, "fp8",
              "Selected Linear layers in float8: all three GEMMs through _scaled_mm, delayed (Transformer Engine) or current scaling",
              Schema()
                  .strings("include", {}, "Substrings of Linear module names to run in fp8 (empty: every Linear)")
                  .strings("exclude", {"lm_head"}, "Substrings of Linear module names kept in high precision (the output head)")
                  .string("recipe", "delayed",
                          "delayed: scales from the amax history of previous steps (Transformer Engine DelayedScaling); current: "
                          "each tensor's own amax (dynamic tensorwise); rowwise: dynamic, a scale per row or column along each GEMM's "
                          "contracted dimension",
                          {"delayed", "current", "rowwise"})
                  .integer("margin", 0, "scale = fp8_max / amax / 2^margin", between(0, 64))
                  .integer("interval", 1, "delayed: recompute the scales every N steps", at_least(1))
                  .string("fp8_format", "HYBRID", "HYBRID: E4M3 forward, E5M2 gradients; E4M3: E4M3 for both", {"HYBRID", "E4M3"})
                  .integer("amax_history_len", 1024, "delayed: steps of amax history kept per tensor", between(1, 1 << 20))
                  .string("amax_compute_algo", "max", "delayed: the amax a scale uses: the history's max or its most recent entry",
                          {"max", "most_recent"})
                  .boolean("reduce_amax", true,
                           "All-reduce amaxes (max) over the data, tensor and context ranks so every rank uses the same scales")},
             {Phase::ModelRewrite, {}, {}, {}, {}}) {}

  void validate(const Config& config, const SourcePos&, Diagnostics& diagnostics) const override {
    const std::string& recipe = config.get_string("recipe");
    if (recipe != "delayed")
      for (const char* key : kDelayedOnly)
        // A saved strategy.toml states every key, defaults included: only a value other than
        // the default is a choice that nothing would honour.
        if (config.entry(key).origin != Origin::Default && config.entry(key).value != info().schema.find(key)->default_value)
          diagnostics.error(config.entry(key).pos, std::string("pass 'fp8' key '") + key + "' applies to recipe 'delayed' only, not '" +
                                                       recipe + "'");
    for (const char* key : {"include", "exclude"})
      for (const auto& entry : config.get_strings(key))
        if (entry.empty()) diagnostics.error(config.entry(key).pos, std::string("pass 'fp8' key '") + key + "' has an empty entry");
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    // The layers are those of the model as each tensor rank builds it; pieces differ by at most
    // one row (nn::shard_range), so the first and the last rank hold both sizes there are.
    std::string out = "fp8 (recipe " + config.get_string("recipe") + ", format " + config.get_string("fp8_format") + "):\n";
    const RngSnapshot rng{c10::Device(c10::kCPU)};
    const std::vector<int64_t> ranks = facts.mesh.tensor > 1 ? std::vector<int64_t>{0, facts.mesh.tensor - 1} : std::vector<int64_t>{0};
    for (int64_t index : ranks) {
      std::shared_ptr<nn::Model> model;
      try {
        at::NoGradGuard no_grad;
        model = facts.model_factory.create_shard(facts.model, nn::TensorShard{facts.mesh.tensor, index});
      } catch (const std::exception& e) {
        rng.restore();
        return out + "  the model could not be built to check its layers: " + e.what() + "\n";
      }
      const LayerChoice choice = choose_layers(*model, config.get_strings("include"), config.get_strings("exclude"));
      std::vector<std::string> names;
      for (const auto& [name, linear] : choice.fp8) names.push_back(name);
      out += "  tensor rank " + std::to_string(index) + ": " + std::to_string(names.size()) + " Linear layers in fp8: " +
             (names.empty() ? "none" : join(names)) + "\n";
      if (!choice.too_small.empty())
        out += "  tensor rank " + std::to_string(index) + ": left in high precision (a dimension not a multiple of 16): " +
               join(choice.too_small) + "\n";
      if (!choice.misaligned.empty())
        out += "  tensor rank " + std::to_string(index) + ": pieces not multiples of 16 (run on the CPU; CUDA's fp8 GEMMs refuse them): " +
               join(choice.misaligned) + "\n";
    }
    rng.restore();
    return out;
  }

  void apply(Job& job, const Config& config) const override {
    // An include or exclude entry that names no Linear layer is a typo that would choose layers
    // without a word: exclude = ["lm-head"] would run the output head in fp8. The default exclude
    // (["lm_head"]) is not checked: a model may have no such layer. A pipeline rank holds its
    // stages' layers only: an entry is refused when no rank's match.
    for (const char* key : {"include", "exclude"}) {
      const StringList& entries = config.get_strings(key);
      if (std::string(key) == "exclude" && entries == StringList{"lm_head"}) continue;
      for (const auto& entry : entries)
        if (!found_on_any_rank(job, names_a_linear(*job.model, entry)))
          throw UserError(std::string("pass 'fp8': ") + key + " entry \"" + entry + "\" is in the name of no Linear layer of model '" +
                          job.job_config().get_string("model") + "' (`strata plan` lists the layers fp8 chooses)");
    }
    const LayerChoice choice = choose_layers(*job.model, config.get_strings("include"), config.get_strings("exclude"));
    // Over every rank: a pipeline rank may hold no Linear layer of its own.
    const bool any_selected = found_on_any_rank(job, !choice.fp8.empty() || !choice.too_small.empty());
    const bool any_fp8 = found_on_any_rank(job, !choice.fp8.empty());
    if (!any_selected) {
      // A plain libtorch model's torch::nn::Linear layers cannot be rewritten: their forward is
      // not virtual and has no hook, so nothing can run their GEMMs in fp8 from outside.
      bool plain_linear = false;
      for (const auto& m : job.model->modules(/*include_self=*/false)) plain_linear |= dynamic_cast<torch::nn::LinearImpl*>(m.get()) != nullptr;
      throw UserError("pass 'fp8': no Linear layer of model '" + job.job_config().get_string("model") + "' matches include/exclude" +
                      (plain_linear ? std::string("; its torch::nn::Linear layers cannot run in fp8 (libtorch's Linear has no hook to "
                                                  "replace its matrix products): write them as strata::nn::Linear (docs/library.md)")
                                    : std::string()));
    }
    if (!any_fp8)
      throw UserError("pass 'fp8': every selected Linear layer has a dimension that is not a multiple of 16: " + join(choice.too_small));
    if (job.device().is_cuda() && !choice.misaligned.empty())
      throw UserError("pass 'fp8': under this layout these fp8 layers' pieces are not multiples of 16, which CUDA's fp8 GEMMs "
                      "need: " + join(choice.misaligned) + "; exclude them (pass 'fp8' exclude) or choose another tensor size");
    const bool report = job.topology->rank() == 0;
    if (report && !choice.too_small.empty())
      std::cout << "fp8: left in high precision (a dimension not a multiple of 16): " << join(choice.too_small) << "\n";

    if (config.get_string("recipe") == "rowwise") {
      apply_rowwise(job, config, choice);
      return;
    }
    auto scaling = std::make_shared<Scaling>();
    scaling->recipe = config.get_string("recipe") == "current" ? Recipe::Current : Recipe::Delayed;
    scaling->backward = config.get_string("fp8_format") == "HYBRID" ? Format::E5M2 : Format::E4M3;
    scaling->margin = config.get_int("margin");
    const std::vector<Dim> amax_dims{Dim::Data, Dim::Tensor, Dim::Context};
    Communicator* group = config.get_bool("reduce_amax") && job.topology->size(amax_dims) > 1 ? &job.topology->group(amax_dims) : nullptr;
    const auto layers = static_cast<int64_t>(choice.fp8.size());

    scaling->current_group = group;
    if (scaling->recipe == Recipe::Delayed) {
      // Per layer: input and weight in the forward format, output gradient in the backward one.
      std::vector<float> maxes;
      for (int64_t k = 0; k < layers; ++k)
        for (Format f : {scaling->forward, scaling->forward, scaling->backward}) maxes.push_back(static_cast<float>(max_of(f)));
      scaling->delayed = std::make_shared<DelayedScaling>(3 * layers, config.get_int("amax_history_len"),
                                                         at::tensor(maxes, at::kFloat), job.device());
      job.register_state("fp8", std::make_shared<State>(scaling->delayed, group != nullptr || job.topology->size(amax_dims) == 1));
      const int64_t interval = config.get_int("interval"), margin = scaling->margin;
      const bool use_max = config.get_string("amax_compute_algo") == "max";
      // Once per step, after its backward passes: every rank agrees on the step's amaxes, they
      // join the history, and every `interval` steps the scales follow it.
      job.add_hook(HookPoint::AfterStep, [scaling, group, interval, margin, use_max](StepContext& context) {
        DelayedScaling& delayed = *scaling->delayed;
        if (group) group->all_reduce(delayed.pending, ReduceOp::Max)->wait();
        delayed.roll();
        if (context.step % interval == 0) delayed.update_scales(use_max, margin);
      });
    }
    job.add_hook(HookPoint::BeforeEvaluate, [scaling](StepContext&) { scaling->evaluating = true; });
    job.add_hook(HookPoint::AfterEvaluate, [scaling](StepContext&) { scaling->evaluating = false; });

    for (int64_t k = 0; k < layers; ++k)
      choice.fp8[k].second->hooks.compute = [scaling, k](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
        return without_autocast(x, [&](at::ScalarType out_dtype) { return fp8_linear(x, w, b, *scaling, k, out_dtype); });
      };
    report_layer_count(job, layers);
  }

 private:
  static void report_layer_count(Job& job, int64_t layers) {
    job.add_hook(HookPoint::AfterStep, [layers](StepContext& context) {
      context.metrics.emplace_back("fp8_layers", static_cast<double>(layers));
    });
  }

  // Rowwise is stateless: each layer knows which ranks share each of its GEMMs' contracted
  // dimensions (fp8_rowwise.h), from its tensor-parallel split.
  static void apply_rowwise(Job& job, const Config& config, const LayerChoice& choice) {
    RowwiseScaling common;
    common.backward = config.get_string("fp8_format") == "HYBRID" ? Format::E5M2 : Format::E4M3;
    common.margin = config.get_int("margin");
    const bool reduce = config.get_bool("reduce_amax");
    const std::vector<Dim> token_dims{Dim::Data, Dim::Context};
    Communicator* tensor = reduce && job.topology->size(Dim::Tensor) > 1 ? &job.topology->group(Dim::Tensor) : nullptr;
    common.tokens = reduce && job.topology->size(token_dims) > 1 ? &job.topology->group(token_dims) : nullptr;
    for (const auto& [name, linear] : choice.fp8) {
      auto scaling = std::make_shared<RowwiseScaling>(common);
      if (linear->parallel_style == nn::ParallelStyle::Row) scaling->in_split = tensor;
      if (linear->parallel_style == nn::ParallelStyle::Column) scaling->out_split = tensor;
      linear->hooks.compute = [scaling](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
        return without_autocast(x, [&](at::ScalarType out_dtype) { return fp8_linear_rowwise(x, w, b, *scaling, out_dtype); });
      };
    }
    report_layer_count(job, static_cast<int64_t>(choice.fp8.size()));
  }
};

void register_components(Registry& registry) {
  cpu_scaled_mm_chosen();  // decided at load, so that `strata ops` lists it
  registry.add(std::make_unique<Fp8Pass>());
}

}  // namespace
}  // namespace strata::fp8

STRATA_PLUGIN("fp8", "0.1.0", strata::fp8::register_components)
