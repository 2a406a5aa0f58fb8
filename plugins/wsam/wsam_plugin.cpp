// WSAM (weighted sharpness-aware minimisation, KDD 2023) as a change of the step program,
// following ../shared/specs/optimizers.md as written up in docs/optimizers.md. It wraps the
// job's gradient computation, so any registered optimizer is its base.
//
// Norms are of the whole model, whatever the layout: a rank holds pieces of split parameters
// (tensor parallel's columns and rows, expert parallel's experts), placed as the parameters are
// (nn::parameter_placements), and pipeline stages hold disjoint blocks. A synchronised gradient's
// norm is clipping's (clip_gradient_norm with the topology: every whole tensor counted once over
// the world); a local gradient (m-sharpness) is this data rank's alone, so its pieces are summed
// over its model replica's tensor and pipeline ranks, which then perturb alike. Under a pipeline
// the wrapped stage runs the whole schedule, twice. The perturbation's scale and the perturbed
// loss stay on the job's device: nothing is read to the host in the step.
//
// WSAM perturbs, restores and steps the master weights: the job's "model" state, the tensors the
// optimizer updates with their gradients attached (the parameters; under zero1, zero2 and fsdp
// this rank's pieces of them, their gradients views of the reduced chunks). After changing them
// in place it loads the state into itself, which is how a state's holder takes new values: the
// parameters need nothing more, zero1 and zero2 all-gather the full parameters, fsdp gathers from
// its pieces when it next runs. With sharding the perturbation must follow the synchronised
// gradient (perturbation = "global"): zero2 and fsdp never hold a rank's whole local gradient.
#include <algorithm>
#include <optional>

#include <ATen/ATen.h>

#include "strata/plugin.h"
#include "strata/rng.h"

namespace strata::wsam {
namespace {

struct Settings {
  double rho, alpha, eps, max_norm;
  bool adaptive, decouple, local;
};

// Averages tensors over a group with one all-reduce of their concatenation, in `dtype` if set.
WorkPtr average(Communicator& group, const std::vector<at::Tensor>& tensors, std::optional<at::ScalarType> dtype,
                at::Tensor& flat) {
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) views.push_back(t.reshape(-1));
  flat = at::cat(views);
  if (dtype) flat = flat.to(*dtype);
  return group.all_reduce(flat, ReduceOp::Avg);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.view(-1).copy_(flat.narrow(0, offset, t.numel()));
    offset += t.numel();
  }
}

class Wsam {
 public:
  Wsam(Job& job, Settings settings)
      : settings_(settings),
        device_(job.device()),
        group_(job.topology->group(Dim::Data)),
        reduce_dtype_(job.reduce_dtype),
        job_(job) {}

  // Wraps the gradients stage (forward_backward, then sync_gradients) and runs it twice.
  void compute(StepContext& context, const StageFn& gradients_of) {
    // The second pass replays the first one's random numbers (dropout masks), so it measures the
    // same stochastic loss at the perturbed point and rho = 0 reproduces the base run exactly.
    const RngSnapshot rng(device_);
    context.sync_gradients = !settings_.local;
    gradients_of(context);
    const at::Tensor loss = context.local_loss;
    context.sync_gradients = true;

    at::NoGradGuard no_grad;
    if (params_.empty()) find_master_weights();
    std::vector<at::Tensor> g = take_gradients();
    std::vector<at::Tensor> saved, scaled;
    for (size_t i = 0; i < params_.size(); ++i) scaled.push_back(settings_.adaptive ? params_[i].abs() * g[i] : g[i]);
    const at::Tensor scale = settings_.rho / (norm(scaled, /*synchronised=*/!settings_.local) + settings_.eps);
    for (size_t i = 0; i < params_.size(); ++i) {
      saved.push_back(params_[i].clone());
      params_[i].add_((settings_.adaptive ? params_[i].square() * g[i] : g[i]) * scale.to(at::kFloat));
    }
    propagate();
    // The local gradient is averaged while the second pass runs.
    at::Tensor flat;
    WorkPtr pending = settings_.local && group_.size() > 1 ? average(group_, g, reduce_dtype_, flat) : nullptr;

    rng.restore();
    {
      at::AutoGradMode enable(true);
      gradients_of(context);
      // Averaged over the data ranks as the step's loss is (reduce_loss), so the figure does
      // not depend on the rank count.
      job_.program.report_device_figure("wsam_perturbed_loss", job_.reduce_loss(context.local_loss));
      context.local_loss = loss;
    }
    std::vector<at::Tensor> perturbed = take_gradients();
    for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(saved[i]);
    propagate();
    if (pending) {
      pending->wait();
      unflatten(flat, g);
    }
    if (settings_.max_norm > 0) {
      // Both gradients are synchronised by now: each clipped by its whole-model norm.
      for (const auto* grads : {&g, &perturbed}) clip_gradient_norm(placed(*grads), settings_.max_norm, job_.topology.get(), device_);
    }

    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor difference = perturbed[i].sub_(g[i]);
      if (settings_.decouple) {
        set_gradient(params_[i], g[i]);
        sharpness_.push_back(difference);
      } else {
        set_gradient(params_[i], g[i].add_(difference, settings_.alpha));
      }
    }
  }

  // The decoupled sharpness step after the base optimizer's: w <- w - lr * alpha * (g~ - g). It
  // follows the base optimizer's step only where that one was taken: where a pass's flag on the
  // device (amp's) skipped it, the weights are kept there (at::where; nothing is read).
  void after_step(const StepContext& context) {
    if (!context.skip_step && !sharpness_.empty()) {
      at::NoGradGuard no_grad;
      const at::Tensor flag = job_.program.skip_flag();
      const at::Tensor skipped = flag.defined() ? flag.ne(0).reshape({}) : at::Tensor();
      for (size_t i = 0; i < params_.size(); ++i) {
        const double scale = context.lr * settings_.alpha;
        if (skipped.defined()) params_[i].copy_(at::where(skipped, params_[i], params_[i].sub(sharpness_[i], scale)));
        else params_[i].sub_(sharpness_[i], scale);
      }
      propagate();
    }
    sharpness_.clear();
  }

 private:
  // The master weights (the header) and their placements, once the optimizer holds them (their
  // gradients are attached by then): the model state's tensors that are trained, placed as the
  // passes left them; pipeline stages hold disjoint ones, as core's local_gradients places them.
  void find_master_weights() {
    const Stateful& state = *job_.states().at("model");
    const Placements placements = state.placements();
    for (const auto& [name, tensor] : state.save()) {
      if (!tensor.requires_grad() && !tensor.grad().defined()) continue;  // frozen
      params_.push_back(tensor);
      const auto placement = placements.find(name);
      placements_.push_back(nest(placement == placements.end() ? Placement{} : placement->second, 0, {Dim::Pipeline}));
    }
  }

  // After the master weights changed in place: the state loads itself (the header).
  void propagate() {
    Stateful& state = *job_.states().at("model");
    state.load(state.save());
  }

  // Copies the master weights' gradients (zeros where one got none) and clears the model's
  // parameters' gradients, so the next backward starts from nothing. Copies: after ddp's or
  // zero1's reduction a gradient is a view of a buffer that the next reduction overwrites, and a
  // sharding pass's piece keeps its gradient view (the optimizer reads it).
  std::vector<at::Tensor> take_gradients() {
    std::vector<at::Tensor> out;
    for (auto& p : params_) out.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    for (auto& p : job_.model->parameters()) p.mutable_grad() = at::Tensor();
    return out;
  }

  // The gradient the optimizer reads: written into the master weight's own (a sharding pass's
  // piece's is a view of its reduced chunk), or attached where it has none.
  static void set_gradient(at::Tensor& weight, const at::Tensor& gradient) {
    if (weight.grad().defined()) weight.mutable_grad().copy_(gradient);
    else weight.mutable_grad() = gradient;
  }

  std::vector<LocalGradient> placed(const std::vector<at::Tensor>& pieces) const {
    std::vector<LocalGradient> out;
    for (size_t i = 0; i < pieces.size(); ++i) out.push_back({pieces[i], placements_[i]});
    return out;
  }

  // The 2-norm of the whole tensors `pieces` are this rank's pieces of (a 0-dim fp64 tensor on
  // the job's device). Synchronised: equal on every data replica, so clipping's rule over the
  // world. Local: this data rank's own, summed over its tensor and pipeline ranks (a piece
  // replicated over the tensor group counted once); an expert's piece counts as this rank's.
  at::Tensor norm(const std::vector<at::Tensor>& pieces, bool synchronised) const {
    if (synchronised) return clip_gradient_norm(placed(pieces), 0.0, job_.topology.get(), device_);
    const int tensor = job_.topology->size(Dim::Tensor);
    at::Tensor squared = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::vector<Dim>& split = placements_[i].sharded_over;  // (Placement::is_sharded_over is core-internal)
      const double copies = std::find(split.begin(), split.end(), Dim::Tensor) != split.end() ? 1.0 : tensor;
      squared += pieces[i].to(at::kFloat).square().sum().to(at::kDouble) / copies;
    }
    Communicator& model_group = job_.topology->group({Dim::Tensor, Dim::Pipeline});  // one replica of the model
    if (model_group.size() > 1) model_group.all_reduce(squared, ReduceOp::Sum)->wait();
    return squared.sqrt();
  }

  Settings settings_;
  c10::Device device_;
  Communicator& group_;
  std::optional<at::ScalarType> reduce_dtype_;
  Job& job_;  // its topology, its reduce_loss as the passes left it, and its program (device figures)
  std::vector<at::Tensor> params_;
  std::vector<Placement> placements_;  // of params_
  std::vector<at::Tensor> sharpness_;
};

class WsamPass final : public Pass {
 public:
  WsamPass()
      : Pass({ComponentKind::Pass, "wsam",
              "Weighted sharpness-aware minimisation: two forward/backward passes per step around the [optimizer] (its base)",
              Schema()
                  .real("rho", 0.05, "Radius of the inner maximisation", at_least(0))
                  .real("gamma", 0.9, "Weight of the sharpness term (alpha = gamma / (1 - gamma)); 0.5 is SAM", between(0, 1))
                  .real("eps", 1e-12, "Stabiliser of the gradient-norm normalisation", at_least(0))
                  .boolean("adaptive", false, "ASAM-style perturbation scaled by |w|")
                  .boolean("decouple", true, "Decoupled sharpness step after the base optimizer's; false folds it into the gradient")
                  .real("max_norm", 0.0, "Clip each of the two gradients to this norm; 0 = no clipping", at_least(0))
                  .string("perturbation", "local",
                          "Gradient the perturbation follows: each rank's own (m-sharpness, the paper's) or the data-parallel "
                          "average (then any rank count matches one process)",
                          {"local", "global"})},
             // After the data-parallel passes: their gradients and master weights are what it wraps.
             {Phase::Schedule, {}, {}, {"ddp", "zero1", "zero2", "fsdp"}, {}}, {{}, {{Stage::Gradients, StageUse::Wrap}}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_float("gamma") >= 1.0) diagnostics.error(section, "pass 'wsam': gamma must be below 1 (alpha = gamma / (1 - gamma))");
  }

  // A rank's own whole gradient (m-sharpness) is never held under zero2 and fsdp, which
  // reduce-scatter in the backward, nor kept apart from the average by zero1.
  std::string plan_problem(const Config& config, const PlanFacts& facts) const override {
    if (config.get_string("perturbation") != "local") return {};
    for (const char* sharding : {"zero1", "zero2", "fsdp"})
      if (std::find(facts.enabled_passes.begin(), facts.enabled_passes.end(), sharding) != facts.enabled_passes.end())
        return std::string("pass 'wsam': perturbation = \"local\" needs each rank's own whole gradient, which ") + sharding +
               " does not keep; set perturbation = \"global\"";
    return {};
  }

  void apply(Job& job, const Config& config) const override {
    const double gamma = config.get_float("gamma");
    auto wsam = std::make_shared<Wsam>(
        job, Settings{config.get_float("rho"), gamma / (1.0 - gamma), config.get_float("eps"), config.get_float("max_norm"),
                      config.get_bool("adaptive"), config.get_bool("decouple"), config.get_string("perturbation") == "local"});
    job.program.wrap(Stage::Gradients, [wsam](StepContext& c, const StageFn& inner) { wsam->compute(c, inner); });
    job.add_hook(HookPoint::AfterStep, [wsam](StepContext& c) { wsam->after_step(c); });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<WsamPass>()); }

}  // namespace
}  // namespace strata::wsam

STRATA_PLUGIN("wsam", "0.1.0", strata::wsam::register_components)
