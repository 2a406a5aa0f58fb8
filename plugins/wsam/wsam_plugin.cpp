// WSAM (weighted sharpness-aware minimisation, KDD 2023) as a change of the step program,
// following ../shared/specs/optimizers.md as written up in docs/optimizers.md. It wraps the
// job's gradient computation, so any registered optimizer is its base.
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
      : settings_(settings), device_(job.device()), group_(job.topology->group(Dim::Data)), reduce_dtype_(job.reduce_dtype) {
    for (const auto& p : job.model->parameters())
      if (p.requires_grad()) params_.push_back(p);
  }

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
    std::vector<at::Tensor> g = take_gradients();
    std::vector<at::Tensor> saved;
    at::Tensor squared = at::zeros({}, params_.front().options().dtype(at::kFloat));
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor scaled = settings_.adaptive ? params_[i].abs() * g[i] : g[i];
      squared += scaled.to(at::kFloat).square().sum();
    }
    const double scale = settings_.rho / (std::sqrt(squared.item<double>()) + settings_.eps);
    for (size_t i = 0; i < params_.size(); ++i) {
      saved.push_back(params_[i].clone());
      params_[i].add_(settings_.adaptive ? params_[i].square() * g[i] : g[i], scale);
    }
    // The local gradient is averaged while the second pass runs.
    at::Tensor flat;
    WorkPtr pending = settings_.local && group_.size() > 1 ? average(group_, g, reduce_dtype_, flat) : nullptr;

    rng.restore();
    {
      at::AutoGradMode enable(true);
      gradients_of(context);
      context.metrics.emplace_back("wsam_perturbed_loss", context.local_loss.item<double>());
      context.local_loss = loss;
    }
    std::vector<at::Tensor> perturbed = take_gradients();
    for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(saved[i]);
    if (pending) {
      pending->wait();
      unflatten(flat, g);
    }
    if (settings_.max_norm > 0) {
      // Each of the two gradients as this rank holds it (whole: WSAM refuses sharding passes).
      for (const auto* grads : {&g, &perturbed}) {
        std::vector<LocalGradient> own;
        for (const auto& t : *grads) own.push_back({t, {}});
        if (!own.empty()) clip_gradient_norm(own, settings_.max_norm, nullptr, own.front().grad.device());
      }
    }

    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor difference = perturbed[i].sub_(g[i]);
      if (settings_.decouple) {
        params_[i].mutable_grad() = g[i];
        sharpness_.push_back(difference);
      } else {
        params_[i].mutable_grad() = g[i].add_(difference, settings_.alpha);
      }
    }
  }

  // The decoupled sharpness step after the base optimizer's: w <- w - lr * alpha * (g~ - g).
  void after_step(const StepContext& context) {
    if (!context.skip_step && !sharpness_.empty()) {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) params_[i].sub_(sharpness_[i], context.lr * settings_.alpha);
    }
    sharpness_.clear();
  }

 private:
  // Takes the gradients out of the parameters (zeros where a parameter got none), so the next
  // backward starts from nothing. A copy: after ddp's reduction a gradient is a view of a bucket
  // buffer that the next reduction overwrites.
  std::vector<at::Tensor> take_gradients() {
    std::vector<at::Tensor> out;
    for (auto& p : params_) {
      out.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
      p.mutable_grad() = at::Tensor();
    }
    return out;
  }

  Settings settings_;
  c10::Device device_;
  Communicator& group_;
  std::optional<at::ScalarType> reduce_dtype_;
  std::vector<at::Tensor> params_;
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
             // The sharding passes reduce every backward into buffers the base optimizer reads
             // (and zero2/fsdp never hold whole gradients), and pipeline schedules run their own
             // forward/backward, so none of them can run WSAM's second pass. Under tensor parallel
             // its gradient norms (perturbation scale, clipping) would cover only this rank's
             // pieces, so each tensor rank would perturb differently: refused until they are
             // group-aware.
             {Phase::Schedule, {}, {"zero1", "zero2", "fsdp", "tensor_parallel"}, {"ddp"}, {}}, {{}, {{Stage::Gradients, StageUse::Wrap}}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_float("gamma") >= 1.0) diagnostics.error(section, "pass 'wsam': gamma must be below 1 (alpha = gamma / (1 - gamma))");
  }

  void apply(Job& job, const Config& config) const override {
    if (job.topology->size(Dim::Pipeline) > 1)
      throw UserError("pass 'wsam' cannot run with [parallel] pipeline > 1: pipeline schedules run their own forward/backward");
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
