// WSAM (weighted sharpness-aware minimisation, KDD 2023) as a change of the step program,
// following ../shared/specs/optimizers.md as written up in docs/optimizers.md. It wraps the
// job's gradient computation, so any registered optimizer is its base.
//
// Norms are of the whole model, whatever the layout: a rank holds pieces of split parameters
// (tensor parallel's columns and rows, expert parallel's experts), placed as the parameters are
// (nn::parameter_placements), and pipeline stages hold disjoint blocks. A synchronised gradient's
// norm is clipping's (clip_gradient_norm with the topology: every whole tensor counted once over
// the world); a local gradient (m-sharpness) is this data rank's alone, so its pieces are summed
// over its model replica's tensor and pipeline ranks, which then perturb alike. WSAM averages a
// local gradient itself, over the ranks that hold the same tensors: the data group, or for
// experts split by expert parallel the data ranks holding the same experts. Under a pipeline
// the wrapped stage runs the whole schedule, twice. The perturbation's scale and the perturbed
// loss stay on the job's device: nothing is read to the host in the step.
//
// WSAM perturbs, restores and steps the master weights: the job's "model" state, the tensors the
// optimizer updates with their gradients attached (the parameters; under zero1, zero2 and fsdp
// this rank's pieces of them, their gradients views of the reduced chunks). After changing them
// in place it loads the state into itself, which is how a state's holder takes new values: the
// parameters need nothing more, zero1 and zero2 all-gather the full parameters, fsdp gathers from
// its pieces when it next runs. A local perturbation under zero1 or zero2 is each rank's own, so
// it cannot live in the shared pieces: it moves the full parameters those passes keep on every
// rank, along this rank's own gradient of them (the passes leave an unsynchronised backward
// alone), and restoring this rank's pieces (saved: they are views of the full parameters'
// buffer) and reloading the state gathers them back exactly; the optimizer then
// gets this rank's pieces of the averaged gradient. fsdp keeps no full parameters between uses:
// there the unsynchronised backward leaves each parameter its own full gradient, and the
// perturbation goes to fsdp as offsets it adds to every gather of the full parameters until WSAM
// clears them (Job::offset_full_parameters); the pieces never move, so nothing is restored.
// Scaled by |w| (adaptive), it takes |w| of the full parameters from the pieces: one all-reduce
// (a maximum) over the data ranks.
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>

#include "../sharding/expert_split.h"
#include "strata/plugin.h"
#include "strata/rng.h"

namespace strata::wsam {
namespace {

struct Settings {
  double rho, alpha, eps, max_norm;
  bool adaptive, decouple, local;
};

bool enabled(const PlanFacts& facts, const char* pass) {
  return std::find(facts.enabled_passes.begin(), facts.enabled_passes.end(), pass) != facts.enabled_passes.end();
}

// Whether a tensor placed as `placement` is a piece of experts split by expert parallel.
bool is_split_expert(const Placement& placement) {
  const std::vector<Dim>& split = placement.sharded_over;  // (Placement::is_sharded_over is core-internal)
  return std::find(split.begin(), split.end(), Dim::Expert) != split.end();
}

// An all-reduce of tensors over a group in flight: one message, their concatenation (in `dtype`
// where set).
struct FlatAllReduce {
  std::vector<at::Tensor> tensors;
  at::Tensor flat;
  WorkPtr work;

  FlatAllReduce(Communicator& group, std::vector<at::Tensor> of, ReduceOp op, std::optional<at::ScalarType> dtype)
      : tensors(std::move(of)) {
    std::vector<at::Tensor> views;
    for (const auto& t : tensors) views.push_back(t.reshape(-1));
    flat = at::cat(views);
    if (dtype) flat = flat.to(*dtype);
    work = group.all_reduce(flat, op);
  }

  // Waits, then writes the results back into the tensors.
  void finish() {
    work->wait();
    int64_t offset = 0;
    for (const auto& t : tensors) {
      t.view(-1).copy_(flat.narrow(0, offset, t.numel()));
      offset += t.numel();
    }
  }
};

class Wsam {
 public:
  Wsam(Job& job, Settings settings)
      : settings_(settings),
        device_(job.device()),
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
    if (params_.empty()) find_weights();
    // What the perturbation moves, and along which gradient: the master weights, or with a local
    // perturbation over pieces the full parameters, in place (zero1, zero2) or as offsets to
    // their gathers (fsdp) (the header).
    const bool moves_full = !full_params_.empty();
    const bool as_offsets = moves_full && gathered_;
    std::vector<at::Tensor>& moved = moves_full ? full_params_ : params_;
    const std::vector<Placement>& moved_placements = moves_full ? full_placements_ : placements_;
    std::vector<at::Tensor> g = take_gradients(moved);
    // The master weights are saved whichever tensors move in place: zero's pieces are views of
    // the full parameters' buffer, so moving those moves this rank's piece too.
    std::vector<at::Tensor> saved;
    if (!as_offsets)
      for (const auto& w : params_) saved.push_back(w.clone());
    {  // |w| and the scaled gradient are not held through the second pass
      // Adaptive: |w| of the moved tensors; fsdp keeps none between uses, so they are put together.
      std::vector<at::Tensor> magnitudes, scaled;
      if (settings_.adaptive) magnitudes = as_offsets ? full_magnitudes(g) : abs_of(moved);
      for (size_t i = 0; i < moved.size(); ++i) scaled.push_back(settings_.adaptive ? magnitudes[i] * g[i] : g[i]);
      const at::Tensor scale = settings_.rho / (norm(scaled, moved_placements, /*synchronised=*/!settings_.local) + settings_.eps);
      // e of moved tensor i: rho (|w|^2 if adaptive) g / n (|w|^2 is w^2 exactly).
      const auto perturbation = [&](size_t i) {
        return (settings_.adaptive ? magnitudes[i].square() * g[i] : g[i]) * scale.to(at::kFloat);
      };
      if (as_offsets) {
        NamedTensors offsets;
        for (size_t i = 0; i < moved.size(); ++i) offsets.emplace_back(full_names_[i], perturbation(i));
        job_.offset_full_parameters()(offsets);
      } else {
        for (size_t i = 0; i < moved.size(); ++i) moved[i].add_(perturbation(i));
        if (!moves_full) propagate();  // (a reload would gather the full parameters back from the pieces)
      }
    }
    // The local gradient is averaged while the second pass runs.
    std::vector<FlatAllReduce> averaging;
    if (settings_.local) averaging = start_over_data(g, moved_placements, ReduceOp::Avg, reduce_dtype_);

    rng.restore();
    {
      at::AutoGradMode enable(true);
      gradients_of(context);
      // Averaged over the data ranks as the step's loss is (reduce_loss), so the figure does
      // not depend on the rank count.
      job_.program.report_device_figure("wsam_perturbed_loss", job_.reduce_loss(context.local_loss));
      context.local_loss = loss;
    }
    std::vector<at::Tensor> perturbed = take_gradients(params_);
    if (as_offsets) {
      job_.offset_full_parameters()({});  // the next gathers give w back from the untouched pieces
    } else {
      for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(saved[i]);
      propagate();
    }
    for (auto& pending : averaging) pending.finish();
    if (moves_full) g = master_pieces_of(g);
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
  // With a local perturbation over pieces of the data ranks' shared parameters (zero1, zero2),
  // also the full parameters, placed as the model's layers left them.
  void find_weights() {
    const Stateful& state = *job_.states().at("model");
    const Placements placements = state.placements();
    bool pieces = false;
    for (const auto& [name, tensor] : state.save()) {
      if (!tensor.requires_grad() && !tensor.grad().defined()) continue;  // frozen
      const auto placement = placements.find(name);
      const Placement placed = placement == placements.end() ? Placement{} : placement->second;
      pieces = pieces || std::find(placed.sharded_over.begin(), placed.sharded_over.end(), Dim::Data) != placed.sharded_over.end();
      params_.push_back(tensor);
      names_.push_back(name);
      offsets_.push_back(placed.offset);
      placements_.push_back(nest(placed, 0, {Dim::Pipeline}));
    }
    if (!settings_.local || !pieces) return;
    // Where a pass gathers the full parameters before each use, they hold nothing between uses
    // (placeholders, to nn::is_placeholder): their gradients are what this reads.
    gathered_ = static_cast<bool>(job_.offset_full_parameters());
    const Placements layer_placements = nn::parameter_placements(*job_.model);
    for (const auto& p : job_.model->named_parameters()) {
      if (!p.value().requires_grad() || (!gathered_ && nn::is_placeholder(p.value()))) continue;
      const auto placement = layer_placements.find(p.key());
      full_index_.emplace(p.key(), full_params_.size());
      full_names_.push_back(p.key());
      full_params_.push_back(p.value());
      full_placements_.push_back(nest(placement == layer_placements.end() ? Placement{} : placement->second, 0, {Dim::Pipeline}));
    }
  }

  // After the master weights changed in place: the state loads itself (the header).
  void propagate() {
    Stateful& state = *job_.states().at("model");
    state.load(state.save());
  }

  // Copies the gradients of `tensors` (zeros where one got none) and clears the model's
  // parameters' gradients, so the next backward starts from nothing. Copies: after ddp's or
  // zero1's reduction a gradient is a view of a buffer that the next reduction overwrites, and a
  // sharding pass's piece keeps its gradient view (the optimizer reads it).
  std::vector<at::Tensor> take_gradients(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    for (const auto& t : tensors) out.push_back(t.grad().defined() ? t.grad().clone() : at::zeros_like(t));
    for (auto& p : job_.model->parameters()) p.mutable_grad() = at::Tensor();
    return out;
  }

  // Starts an all-reduce of this data rank's full tensors (placed as `placements`) over the
  // ranks that hold the same tensors: the data group, and for split experts the data ranks
  // holding the same experts.
  std::vector<FlatAllReduce> start_over_data(const std::vector<at::Tensor>& tensors, const std::vector<Placement>& placements,
                                             ReduceOp op, std::optional<at::ScalarType> dtype) {
    std::vector<at::Tensor> dense, experts;
    for (size_t i = 0; i < tensors.size(); ++i) (is_split_expert(placements[i]) ? experts : dense).push_back(tensors[i]);
    std::vector<FlatAllReduce> out;
    Communicator& data = job_.topology->group(Dim::Data);
    if (data.size() > 1 && !dense.empty()) out.emplace_back(data, std::move(dense), op, dtype);
    Communicator& expert_data = job_.topology->expert_data_group();
    if (expert_data.size() > 1 && !experts.empty()) out.emplace_back(expert_data, std::move(experts), op, dtype);
    return out;
  }

  static std::vector<at::Tensor> abs_of(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    for (const auto& t : tensors) out.push_back(t.abs());
    return out;
  }

  // |w| of the full parameters, shaped as their gradients `like`, from the master weights'
  // pieces, where a pass gathers the parameters before each use (fsdp): each rank writes |its
  // pieces| into zeros, and a maximum over the ranks sharing the tensors fills in the rest. The
  // pieces are disjoint or equal (HSDP's replicas, ignored blocks), so the maximum is exactly
  // |w| (a sum would count the replicas twice): one all-reduce of the full parameters, in fp32.
  std::vector<at::Tensor> full_magnitudes(const std::vector<at::Tensor>& like) {
    std::vector<at::Tensor> out;
    for (const auto& g : like) out.push_back(at::zeros(g.sizes(), params_.front().options()));
    for (size_t i = 0; i < params_.size(); ++i)
      out[full_index_.at(names_[i])].view(-1).narrow(0, offsets_[i], params_[i].numel()).copy_(params_[i].abs().reshape(-1));
    for (auto& pending : start_over_data(out, full_placements_, ReduceOp::Max, std::nullopt)) pending.finish();
    return out;
  }

  // This rank's pieces of full-parameter gradients, shaped and placed as the master weights: a
  // piece is the elements [offset, +numel) of its parameter's flattening.
  std::vector<at::Tensor> master_pieces_of(const std::vector<at::Tensor>& full) const {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < params_.size(); ++i)
      out.push_back(full[full_index_.at(names_[i])].reshape(-1).narrow(0, offsets_[i], params_[i].numel()).view_as(params_[i]));
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

  // The 2-norm of the whole tensors `pieces` (placed as `placements`) are this rank's pieces of
  // (a 0-dim fp64 tensor on the job's device). Synchronised: equal on every data replica, so
  // clipping's rule over the world. Local: this data rank's own, summed over its tensor and
  // pipeline ranks (a piece replicated over the tensor group counted once); an expert's piece
  // counts as this rank's.
  at::Tensor norm(const std::vector<at::Tensor>& pieces, const std::vector<Placement>& placements, bool synchronised) const {
    if (synchronised) return clip_gradient_norm(placed(pieces), 0.0, job_.topology.get(), device_);
    const int tensor = job_.topology->size(Dim::Tensor);
    at::Tensor squared = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::vector<Dim>& split = placements[i].sharded_over;
      const double copies = std::find(split.begin(), split.end(), Dim::Tensor) != split.end() ? 1.0 : tensor;
      squared += pieces[i].to(at::kFloat).square().sum().to(at::kDouble) / copies;
    }
    Communicator& model_group = job_.topology->group({Dim::Tensor, Dim::Pipeline});  // one replica of the model
    if (model_group.size() > 1) model_group.all_reduce(squared, ReduceOp::Sum)->wait();
    return squared.sqrt();
  }

  Settings settings_;
  c10::Device device_;
  std::optional<at::ScalarType> reduce_dtype_;
  Job& job_;  // its topology, its reduce_loss as the passes left it, and its program (device figures)
  // The master weights: their names, offsets in their parameters (a sharding pass's pieces) and placements.
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_;
  std::vector<Placement> placements_;
  // The full parameters a local perturbation moves under zero1, zero2 and fsdp (else empty), and
  // whether a pass gathers them before each use (fsdp: moved by offsets to its gathers).
  std::vector<at::Tensor> full_params_;
  std::vector<std::string> full_names_;
  bool gathered_ = false;
  std::vector<Placement> full_placements_;
  std::map<std::string, size_t> full_index_;
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

  // One line for `strata plan`: which gradient the perturbation follows and what it moves.
  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    const std::string own = "e follows each data rank's own first gradient (left unreduced, then averaged by WSAM) and";
    std::string moves;
    if (config.get_string("perturbation") == "global")
      moves = "e follows the data-parallel average of the first gradient and moves the master weights, restored after the second backward";
    else if (enabled(facts, "fsdp"))
      moves = own + (config.get_bool("adaptive") ? ", scaled by |w| of the full parameters (put together from fsdp's pieces), " : " ") +
              "is added to fsdp's gathers of the full parameters until the second backward ends";
    else if (enabled(facts, "zero1") || enabled(facts, "zero2"))
      moves = own + " moves the full parameters zero keeps, restored after the second backward";
    else
      moves = own + " moves the parameters, restored after the second backward";
    std::ostringstream numbers;
    numbers << "(rho = " << config.get_float("rho") << "): " << moves << "; the optimizer steps with the averaged first gradient and alpha = "
            << config.get_float("gamma") / (1.0 - config.get_float("gamma")) << " times the sharpness difference "
            << (config.get_bool("decouple") ? "after its step" : "folded in");
    return "wsam: two forward/backward passes a step, the second at w + e " + numbers.str();
  }

  // A step runs the gradients stage twice: twice the FLOPs, and the second backward's reduction
  // as well as the first's (a local first gradient WSAM averages itself: the same bytes, in one
  // message). Held through the second pass: a copy of the master weights and the first gradient,
  // counted with the optimizer's state (they live as long as a step). A global first gradient is
  // the synchronised one, as the layout keeps it; a local one is this rank's gradient of the full
  // parameters it holds (ddp's, zero's), 4 bytes a parameter like the weights, and its average
  // is taken in one flat buffer of the same size. Under fsdp the full parameters are not held:
  // the local gradient, the offsets fsdp adds to its gathers and the averaging buffer are each
  // of this replica's full parameters (of its tensor and pipeline share, and of the routed
  // experts only the 1/P expert parallel keeps on it), and nothing is copied; adaptive adds |w|
  // of them and its all-reduce buffer, briefly, and that all-reduce (the split experts' over
  // their expert-data group). Mixtral at data 2 x expert 2 under fsdp (resharding after the
  // forward) held 14.91 MB more with a local WSAM than without, predicted 14.72 MB (27.30 MB
  // before the experts' split counted; cli.tune_expert_parallel_matches_trials).
  void estimate(const Config& config, const PlanFacts& facts, CostEstimate& c) const override {
    const bool local = config.get_string("perturbation") == "local";
    const bool gathers = enabled(facts, "fsdp");
    c.flops *= 2;
    c.comm_bytes *= 2;
    c.messages += local ? 1 : c.messages;
    if (local && gathers) {
      const sharding::ExpertSplit split = sharding::expert_split(facts, c);
      const double full = 4.0 * static_cast<double>(c.model.parameters) * split.kept() / static_cast<double>(c.tensor * c.pipeline);
      c.optimizer_bytes += 2 * full;
      const bool adaptive = config.get_bool("adaptive");
      c.transient_bytes = std::max(c.transient_bytes, adaptive ? 2 * full : full);
      if (adaptive) {  // a ring all-reduce's 2(g-1)/g of each part over its group
        const double d = static_cast<double>(c.data);
        c.comm_bytes += 2 * sharding::data_ring_share(split, d) * full;
        c.messages += split.fraction() > 0 && d / split.ranks > 1 ? 2 : 1;
      }
      return;
    }
    c.optimizer_bytes += c.weight_bytes + (local ? c.weight_bytes : c.gradient_bytes);
    if (local) c.transient_bytes = std::max(c.transient_bytes, c.weight_bytes);
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
