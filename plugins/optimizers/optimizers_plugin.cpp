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

// Gated steps (amp's fp16 non-finite check, strata/optimizer.h's GatedOptimizer): on the CPU the
// flag is host memory and is branched on. On a CUDA device the update is ATen's fused AdamW (the
// kernel adamw_update.fused_cuda runs) with the flag as its found_inf, which leaves every tensor
// as it was where the flag is set; the step t then lives on the device too, counted up only where
// the update was taken, as torch.optim.AdamW(fused=True) does under a GradScaler. From the first
// such step the checkpointed "step" is that device count (state_tensors() names it; a save reads
// it, a load writes it), so no step reads it. Forced on the CPU (gate_flag_on_host), the device path
// runs ATen's fused AdamW's CPU kernel: CI runs that path's skips, step counts and checkpoints.
class AdamW final : public Optimizer, public GatedOptimizer {
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
    take_device_step();
    step_ += 1;
    ops::AdamwHyper h{lr, beta1_, beta2_, eps_, 0.0, step_.item<int64_t>()};
    for_each_kind([&](Lists& lists, double weight_decay) {
      h.weight_decay = weight_decay;
      ops::adamw_update(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, h);
    });
  }

  void step_unless(double lr, const at::Tensor& skip) override {
    if (gate_flag_on_host(skip)) {
      if (skip.item<double>() == 0) step(lr);
      return;
    }
    at::NoGradGuard no_grad;
    // ATen's kernel skips where found_inf is exactly 1, and reads t as a float.
    const at::Tensor found_inf = skip.ne(0).to(at::kFloat);
    if (!device_step_.defined()) device_step_ = at::full({}, step_.item<int64_t>(), found_inf.options().dtype(at::kLong));
    const at::Tensor t = (device_step_ + 1).to(at::kFloat);
    for_each_kind([&](Lists& lists, double weight_decay) {
      TORCH_CHECK(lists.params.front().device() == found_inf.device(),
                  "adamw: a gated step's flag is on ", found_inf.device(), ", parameters on ", lists.params.front().device());
      const std::vector<at::Tensor> steps(lists.params.size(), t);  // ATen reads steps[i] for tensor i
      at::_fused_adamw_(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, {}, steps, lr, beta1_, beta2_,
                        weight_decay, eps_, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    });
    device_step_.add_(found_inf.eq(0).to(at::kLong));
  }

  NamedTensors state_tensors() override {
    NamedTensors out{{"step", device_step_.defined() ? device_step_ : step_}};
    out.insert(out.end(), state_.named().begin(), state_.named().end());
    return out;
  }

 private:
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  // `update` once per group and (device, dtype) of its parameters that have a gradient.
  template <class Update>
  void for_each_kind(Update update) {
    size_t index = 0;
    for (auto& g : groups_) {
      std::map<std::pair<std::string, c10::ScalarType>, Lists> by_kind;  // device as text: c10::Device has no order
      for (auto& p : g.params) {
        auto& s = state_.of(index++);
        if (!p.grad().defined()) continue;
        Lists& lists = by_kind[{p.device().str(), p.scalar_type()}];
        lists.params.push_back(p), lists.grads.push_back(p.grad()), lists.exp_avgs.push_back(s[0]), lists.exp_avg_sqs.push_back(s[1]);
      }
      for (auto& [kind, lists] : by_kind) update(lists, g.weight_decay);
    }
  }

  // An ungated step after gated ones on a device (not within one run): the device's count back
  // into the host's step (one counted read), which is the count again from here on.
  void take_device_step() {
    if (!device_step_.defined()) return;
    step_.fill_(static_cast<int64_t>(read_on_host({device_step_})[0]));
    device_step_ = at::Tensor();
  }

  std::vector<ParamGroup> groups_;
  double beta1_, beta2_, eps_;
  at::Tensor step_;         // updates taken (checkpointed until gated steps run on a device)
  at::Tensor device_step_;  // from the first gated step on a device: updates taken, there (checkpointed)
  PerParameterState state_;
};

// A gated step on a device computes the update out of place and keeps the old values where the
// flag is set (at::where: a non-finite gradient never reaches a kept value); where it is not, the
// values are those of step(), bit for bit (the same operations).
class Sgd final : public Optimizer, public GatedOptimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, const Config& c)
      : groups_(std::move(groups)), momentum_(c.get_float("momentum")), nesterov_(c.get_bool("nesterov")) {
    // Without momentum there is no buffer (torch.optim.SGD keeps none either): a parameter's
    // worth of memory per parameter saved.
    const std::vector<std::string> slots = momentum_ != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
    for (const auto& g : groups_)
      for (size_t i = 0; i < g.params.size(); ++i) state_.add(g.names[i], g.params[i], slots);
  }

  void step(double lr) override { update(lr, at::Tensor()); }

  void step_unless(double lr, const at::Tensor& skip) override {
    if (!gate_flag_on_host(skip)) return update(lr, skip.ne(0).reshape({}));
    if (skip.item<double>() == 0) step(lr);
  }

  NamedTensors state_tensors() override { return state_.named(); }

 private:
  // One step; with `skipped` (a bool on the parameters' device) the old values are kept where it
  // is true.
  void update(double lr, const at::Tensor& skipped) {
    at::NoGradGuard no_grad;
    const bool gated = skipped.defined();
    size_t index = 0;
    for (auto& g : groups_)
      for (auto& p : g.params) {
        std::vector<at::Tensor>& slots = state_.of(index++);
        if (!p.grad().defined()) continue;
        at::Tensor d = g.weight_decay != 0 ? p.grad() + g.weight_decay * p : p.grad();
        if (momentum_ != 0) {
          // The buffer starts at zero, so the first step leaves it equal to d, as PyTorch's does.
          at::Tensor& buffer = slots[0];
          const at::Tensor next = gated ? buffer.mul(momentum_).add_(d) : buffer.mul_(momentum_).add_(d);
          if (gated) buffer.copy_(at::where(skipped, buffer, next));
          d = nesterov_ ? d + momentum_ * next : next;
        }
        if (gated) p.copy_(at::where(skipped, p, p.add(d, -lr)));
        else p.add_(d, -lr);
      }
  }

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
