// AdamW and SGD with momentum, with PyTorch's update rules (torch.optim.AdamW / SGD), so runs can
// be compared with PyTorch step for step.
#include <cmath>
#include <map>

#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace strata::optimizers {
namespace {

// Keeps per-parameter state tensors shaped like the parameters, named "<param>.<slot>".
class PerParameterState {
 public:
  void add(const std::string& name, const at::Tensor& param, const std::vector<std::string>& slots) {
    std::vector<at::Tensor> tensors;
    for (const auto& slot : slots) {
      tensors.push_back(at::zeros_like(param, at::MemoryFormat::Contiguous));
      named_.emplace_back(name + "." + slot, tensors.back());
    }
    by_param_.push_back(std::move(tensors));
  }
  std::vector<at::Tensor>& of(size_t index) { return by_param_[index]; }
  const NamedTensors& named() const { return named_; }

 private:
  std::vector<std::vector<at::Tensor>> by_param_;
  NamedTensors named_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const Config& c)
      : groups_(std::move(groups)),
        beta1_(c.get_float("beta1")),
        beta2_(c.get_float("beta2")),
        eps_(c.get_float("eps")),
        step_(at::zeros({}, at::kLong)) {
    for (const auto& g : groups_)
      for (size_t i = 0; i < g.params.size(); ++i) state_.add(g.names[i], g.params[i], {"exp_avg", "exp_avg_sq"});
  }

  // Each group's update is one adamw_update operator call per (device, dtype) of its parameters:
  // the reference is torch.optim.AdamW's arithmetic one ATen call at a time; kernels/ serves fp32
  // CPU tensors in one pass each and CUDA tensors in multi-tensor launches.
  void step(double lr) override {
    at::NoGradGuard no_grad;
    step_ += 1;
    ops::AdamwHyper h{lr, beta1_, beta2_, eps_, 0.0, step_.item<int64_t>()};
    size_t index = 0;
    for (auto& g : groups_) {
      struct Lists {
        std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
      };
      std::map<std::pair<std::string, c10::ScalarType>, Lists> by_kind;  // device as text: c10::Device has no order
      for (auto& p : g.params) {
        auto& s = state_.of(index++);
        if (!p.grad().defined()) continue;
        Lists& lists = by_kind[{p.device().str(), p.scalar_type()}];
        lists.params.push_back(p), lists.grads.push_back(p.grad()), lists.exp_avgs.push_back(s[0]), lists.exp_avg_sqs.push_back(s[1]);
      }
      h.weight_decay = g.weight_decay;
      for (auto& [kind, lists] : by_kind) ops::adamw_update(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, h);
    }
  }

  NamedTensors state_tensors() override {
    NamedTensors out{{"step", step_}};
    out.insert(out.end(), state_.named().begin(), state_.named().end());
    return out;
  }

 private:
  std::vector<ParamGroup> groups_;
  double beta1_, beta2_, eps_;
  at::Tensor step_;
  PerParameterState state_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, const Config& c)
      : groups_(std::move(groups)), momentum_(c.get_float("momentum")), nesterov_(c.get_bool("nesterov")) {
    // Without momentum there is no buffer (torch.optim.SGD keeps none either): a parameter's
    // worth of memory per parameter saved.
    const std::vector<std::string> slots = momentum_ != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
    for (const auto& g : groups_)
      for (size_t i = 0; i < g.params.size(); ++i) state_.add(g.names[i], g.params[i], slots);
  }

  void step(double lr) override {
    at::NoGradGuard no_grad;
    size_t index = 0;
    for (auto& g : groups_)
      for (auto& p : g.params) {
        std::vector<at::Tensor>& slots = state_.of(index++);
        if (!p.grad().defined()) continue;
        at::Tensor d = g.weight_decay != 0 ? p.grad() + g.weight_decay * p : p.grad();
        if (momentum_ != 0) {
          // The buffer starts at zero, so the first step leaves it equal to d, as PyTorch's does.
          at::Tensor& buffer = slots[0];
          buffer.mul_(momentum_).add_(d);
          d = nesterov_ ? d + momentum_ * buffer : buffer;
        }
        p.add_(d, -lr);
      }
  }

  NamedTensors state_tensors() override { return state_.named(); }

 private:
  std::vector<ParamGroup> groups_;
  double momentum_;
  bool nesterov_;
  PerParameterState state_;
};

template <class Impl>
class Factory final : public OptimizerFactory {
 public:
  using OptimizerFactory::OptimizerFactory;
  std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const Config& config) const override {
    return std::make_unique<Impl>(std::move(groups), config);
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<Factory<AdamW>>(ComponentInfo{
      ComponentKind::Optimizer, "adamw", "AdamW with decoupled weight decay (torch.optim.AdamW's update)",
      Schema()
          .real("beta1", 0.9, "First-moment decay", between(0, 1))
          .real("beta2", 0.95, "Second-moment decay", between(0, 1))
          .real("eps", 1e-8, "Denominator stabiliser", at_least(0))}));
  registry.add(std::make_unique<Factory<Sgd>>(ComponentInfo{
      ComponentKind::Optimizer, "sgd", "SGD with momentum and L2 weight decay (torch.optim.SGD's update)",
      Schema().real("momentum", 0.9, "Momentum factor; 0 = plain SGD", between(0, 1)).boolean("nesterov", false, "Nesterov momentum")}));
}

}  // namespace
}  // namespace strata::optimizers

STRATA_PLUGIN("optimizers", "0.2.0", strata::optimizers::register_components)
