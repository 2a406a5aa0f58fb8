#include "sharded_training.h"

#include <algorithm>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "strata/errors.h"

namespace strata::sharding {

bool holds(const Units& units, const FlatUnit& unit) {
  return std::any_of(units.begin(), units.end(), [&](const auto& u) { return u.get() == &unit; });
}

namespace {

std::map<std::string, Piece> pieces_by_name(const Units& units) {
  std::map<std::string, Piece> out;
  for (const auto& unit : units)
    for (const auto& piece : unit->pieces()) out.emplace(piece.name, piece);
  return out;
}

// The base optimizer updates this rank's pieces (views of its chunks) in place; the units then
// all-gather what changed. A gated step goes to the base optimizer as one (read here if the base
// cannot gate); the units gather after it either way, unchanged pieces where it was skipped.
class ShardedOptimizer final : public Optimizer, public GatedOptimizer {
 public:
  ShardedOptimizer(std::unique_ptr<Optimizer> inner, std::map<std::string, Piece> pieces, Units units, std::shared_ptr<Traffic> gathered)
      : inner_(std::move(inner)), pieces_(std::move(pieces)), units_(std::move(units)), gathered_(std::move(gathered)) {}

  void step(double lr) override {
    inner_->step(lr);
    *gathered_ += refresh_all(units_);
  }

  void step_unless(double lr, const at::Tensor& skip) override {
    if (auto* gated = dynamic_cast<GatedOptimizer*>(inner_.get())) {
      gated->step_unless(lr, skip);
      *gathered_ += refresh_all(units_);
    } else if (read_on_host({skip})[0] == 0) {
      step(lr);
    }
  }

  NamedTensors state_tensors() override { return inner_->state_tensors(); }

  // State that follows a parameter is placed as this rank's piece of it.
  Placements state_placements() override {
    std::map<std::string, at::Tensor> data;
    Placements placements;
    for (const auto& [name, piece] : pieces_) data.emplace(name, piece.data), placements.emplace(name, piece.placement);
    return state_placements_by_parameter(inner_->state_tensors(), data, placements);
  }

 private:
  std::unique_ptr<Optimizer> inner_;
  std::map<std::string, Piece> pieces_;
  Units units_;
  std::shared_ptr<Traffic> gathered_;
};

// The model as this rank holds it: its pieces of every parameter.
class ShardedModelState final : public Stateful {
 public:
  explicit ShardedModelState(Units units) : units_(std::move(units)) {}

  NamedTensors save() const override {
    NamedTensors out;
    for (const auto& unit : units_)
      for (const auto& piece : unit->pieces())
        if (piece.data.defined()) out.emplace_back(piece.name, piece.data);
    return out;
  }

  Placements placements() const override {
    Placements out;
    for (const auto& unit : units_)
      for (const auto& piece : unit->pieces())
        if (piece.data.defined()) out.emplace(piece.name, piece.placement);
    return out;
  }

  void load(const NamedTensors& tensors) override {
    std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
    at::NoGradGuard no_grad;
    for (const auto& unit : units_)
      for (const auto& piece : unit->pieces()) {
        if (!piece.data.defined()) continue;
        auto it = by_name.find(piece.name);
        if (it == by_name.end() || it->second.sizes() != piece.data.sizes())
          throw UserError("checkpoint model state lacks this rank's piece of '" + piece.name + "'");
        piece.data.copy_(it->second);
      }
    refresh_all(units_);
  }

 private:
  Units units_;
};

}  // namespace

std::function<bool(const std::string&)> split_expert_predicate(const nn::Model& model) {
  // Block by block: an outline's absent blocks report the placements they were built with.
  std::set<std::string> split;
  for (size_t b = 0; b < model.num_blocks(); ++b)
    for (const auto& [name, placement] : nn::parameter_placements(model.block(b))) {
      const std::vector<Dim>& dims = placement.sharded_over;  // (Placement::is_sharded_over is core-internal)
      if (std::find(dims.begin(), dims.end(), Dim::Expert) != dims.end()) split.insert(model.block_name(b) + "." + name);
    }
  return [split = std::move(split)](const std::string& name) { return split.count(name) > 0; };
}

void broadcast_model_state(nn::Model& model, Communicator& data, Communicator& expert_data, bool buffers) {
  const auto split_expert = split_expert_predicate(model);
  at::NoGradGuard no_grad;
  for (auto& p : model.named_parameters())
    if (!nn::is_placeholder(p.value())) (split_expert(p.key()) ? expert_data : data).broadcast(p.value(), 0)->wait();
  if (buffers)
    for (auto& b : model.buffers()) data.broadcast(b, 0)->wait();
}

Schema add_unused_parameters_key(Schema schema) {
  return schema.string("unused_parameters", "error", "Parameters that get no gradient: report them by name, or reduce zeros",
                       {"error", "ignore"});
}

bool ignores_unused_parameters(const Config& config) { return config.get_string("unused_parameters") == "ignore"; }

void check_unused_parameters(const std::string& pass, bool ignore, const Units& units) {
  if (ignore) return;
  std::string list;
  for (const auto& unit : units)
    for (const auto& name : unit->missing_gradients()) list += (list.empty() ? "" : ", ") + name;
  if (list.empty()) return;
  // No collective may be left in flight while the error unwinds: every rank fails here alike.
  for (const auto& unit : units) unit->wait_reduced();
  throw UserError("pass '" + pass + "': parameters got no gradient this step: " + list +
                  "; set unused_parameters = \"ignore\" if that is expected");
}

Traffic refresh_all(const Units& units) {
  std::vector<WorkPtr> works;
  Traffic traffic;
  for (const auto& unit : units)
    if (auto work = unit->start_refresh()) works.push_back(std::move(work)), traffic += unit->gather_traffic();
  for (auto& work : works) work->wait();
  return traffic;
}

std::shared_ptr<Traffic> shard_training_state(Job& job, const Units& units) {
  const Placements parameter_placements = nn::parameter_placements(*job.model);
  for (const auto& unit : units) unit->nest_pieces_in(parameter_placements);
  const std::map<std::string, Piece> pieces = pieces_by_name(units);
  for (const auto& p : job.model->named_parameters())
    if (p.value().requires_grad() && !pieces.count(p.key()))
      throw std::logic_error("sharding: parameter '" + p.key() + "' is in no unit");

  auto gathered = std::make_shared<Traffic>();
  job.make_optimizer = [base = job.make_optimizer, pieces, units, gathered](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
    std::vector<ParamGroup> local;
    for (const auto& group : groups) {
      ParamGroup mine{{}, {}, group.weight_decay};
      for (const auto& name : group.names) {
        const Piece& piece = pieces.at(name);
        if (!piece.data.defined()) continue;
        at::Tensor data = piece.data;
        data.mutable_grad() = piece.grad;
        mine.names.push_back(name);
        mine.params.push_back(data);
      }
      local.push_back(std::move(mine));
    }
    return std::make_unique<ShardedOptimizer>(base(std::move(local)), pieces, units, gathered);
  };
  job.replace_state("model", std::make_shared<ShardedModelState>(units));
  // This rank's pieces, placed as their parameters' pieces; stages hold disjoint parameters.
  job.local_gradients = [units] {
    std::vector<LocalGradient> grads;
    for (const auto& unit : units)
      for (const auto& piece : unit->pieces())
        if (piece.grad.defined()) grads.push_back({piece.grad, nest(piece.placement, 0, {Dim::Pipeline})});
    return grads;
  };
  return gathered;
}

void on_gradient_accumulated(const Units& units, std::function<void(size_t unit, size_t param)> ready) {
  struct Hook final : torch::autograd::PostAccumulateGradHook {
    std::shared_ptr<std::function<void(size_t, size_t)>> ready;
    std::shared_ptr<FlatUnit> flat_unit;  // the parameter's
    size_t unit, param;
    Hook(std::shared_ptr<std::function<void(size_t, size_t)>> r, std::shared_ptr<FlatUnit> f, size_t u, size_t p)
        : ready(std::move(r)), flat_unit(std::move(f)), unit(u), param(p) {}
    void operator()(const torch::autograd::Variable&) override {
      flat_unit->adopt_gradient(param);
      (*ready)(unit, param);
    }
  };
  auto shared = std::make_shared<std::function<void(size_t, size_t)>>(std::move(ready));
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i = 0; i < units[u]->params().size(); ++i)
      torch::autograd::impl::set_post_acc_grad_hooks(units[u]->params()[i].second, std::make_unique<Hook>(shared, units[u], u, i));
}

void release_gradients_before_each_step(Job& job, const Units& units) {
  job.add_hook(HookPoint::BeforeForward, [units](StepContext& c) {
    if (c.micro != 0) return;
    for (const auto& unit : units) unit->release_gradients();
  });
}

}  // namespace strata::sharding
