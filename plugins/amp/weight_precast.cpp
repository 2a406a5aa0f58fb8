#include "weight_precast.h"

#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace strata::amp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Casts `params` to `dtype` in one multi-tensor copy; backward casts the gradients that arrive
// back to the parameters' dtype in another. Nothing is saved: a pipeline's micro-batches may run
// backward through the same node more than once.
class CastTogether : public torch::autograd::Function<CastTogether> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList params, c10::ScalarType dtype) {
    ctx->saved_data["master_dtype"] = static_cast<int64_t>(params.front().scalar_type());
    variable_list copies;
    copies.reserve(params.size());
    for (const at::Tensor& p : params) copies.push_back(at::empty_like(p, p.options().dtype(dtype)));
    at::_foreach_copy_(copies, params);
    return copies;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto master = static_cast<c10::ScalarType>(ctx->saved_data["master_dtype"].toInt());
    variable_list out(grads.size() + 1);  // + the dtype argument's (none)
    std::vector<at::Tensor> from, to;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      out[i] = at::empty_like(grads[i], grads[i].options().dtype(master));
      from.push_back(grads[i]), to.push_back(out[i]);
    }
    if (!from.empty()) at::_foreach_copy_(to, from);
    return out;
  }
};

// One block's plain Linear weights and biases and this forward's copies of them.
class BlockPrecast {
 public:
  BlockPrecast(std::vector<at::Tensor> params, c10::ScalarType dtype) : params_(std::move(params)), dtype_(dtype) {}

  // What the layer uses for parameter `i` (`current`, the parameter itself, when autocast is off
  // or casts it to another dtype, or when the parameter is not fp32).
  at::Tensor serve(size_t i, const at::Tensor& current) {
    const c10::DeviceType device = current.device().type();
    if (!at::autocast::is_autocast_enabled(device) || at::autocast::get_autocast_dtype(device) != dtype_ ||
        current.scalar_type() != at::kFloat)
      return current;
    const bool recording = at::GradMode::is_enabled();
    if (copies_.empty() || (recording && !copies_record_)) {
      for (const at::Tensor& p : params_)
        if (p.scalar_type() != at::kFloat) return current;  // a mixed block: autocast's own casts
      copies_ = CastTogether::apply(at::TensorList(params_), dtype_);  // a list autograd tracks
      copies_record_ = recording;
      served_ += static_cast<int64_t>(params_.size());
    }
    return copies_[i];
  }

  void clear() { copies_.clear(); }
  int64_t take_served() { return std::exchange(served_, 0); }

 private:
  std::vector<at::Tensor> params_;
  c10::ScalarType dtype_;
  variable_list copies_;
  bool copies_record_ = false;
  int64_t served_ = 0;  // parameters served from copies since the last report
};

bool plain(const nn::Linear& linear) {
  return !linear.hooks.on_weight && !linear.hooks.on_bias && !linear.hooks.compute && !linear.split_weight_gradient;
}

// Whether autocast casts the layer's bias: a Row-split layer adds its bias after summing the
// ranks' outputs, outside the linear, where fp32 bias + 16-bit output computes in fp32.
bool casts_bias(const nn::Linear& linear) {
  return linear.bias.defined() && !(linear.parallel_style == nn::ParallelStyle::Row && linear.shard.parts > 1);
}

// Sets the precast hooks on the plain Linear layers of every block of `model`.
std::vector<std::shared_ptr<BlockPrecast>> install(nn::Model& model, c10::ScalarType dtype) {
  std::vector<std::shared_ptr<BlockPrecast>> blocks;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    std::vector<nn::Linear*> layers;
    std::vector<at::Tensor> params;
    for (const auto& module : model.block(b).modules(/*include_self=*/false)) {
      auto* linear = dynamic_cast<nn::Linear*>(module.get());
      if (!linear || !plain(*linear) || !linear->weight.requires_grad()) continue;
      layers.push_back(linear);
      params.push_back(linear->weight);
      if (casts_bias(*linear)) params.push_back(linear->bias);
    }
    if (layers.empty()) continue;
    auto block = std::make_shared<BlockPrecast>(params, dtype);
    size_t index = 0;
    for (nn::Linear* linear : layers) {
      linear->hooks.on_weight = [block, i = index++](const at::Tensor& w) { return block->serve(i, w); };
      if (casts_bias(*linear)) linear->hooks.on_bias = [block, i = index++](const at::Tensor& b) { return block->serve(i, b); };
    }
    blocks.push_back(std::move(block));
  }
  return blocks;
}

}  // namespace

void install_weight_precast(Job& job, c10::ScalarType compute_dtype) {
  struct State {
    bool installed = false;
    std::vector<std::shared_ptr<BlockPrecast>> blocks;
    int64_t served = 0;
  };
  auto state = std::make_shared<State>();
  // At the first forward every pass has applied, so the layers other passes intercept are known.
  // Copies are dropped before each forward too: a checkpointed block's recompute in backward
  // makes some after the last forward, from weights the optimizer step then changes.
  const auto begin = [state, &job, compute_dtype](StepContext&) {
    if (!state->installed) state->blocks = install(*job.model, compute_dtype), state->installed = true;
    for (auto& block : state->blocks) block->clear(), block->take_served();
  };
  job.add_hook(HookPoint::BeforeForward, begin);
  job.add_hook(HookPoint::BeforeEvaluate, begin);
  job.add_hook(HookPoint::AfterForward, [state](StepContext&) {
    for (auto& block : state->blocks) block->clear(), state->served += block->take_served();
  });
  job.add_hook(HookPoint::AfterEvaluate, [state](StepContext&) {
    for (auto& block : state->blocks) block->clear();
  });
  job.add_hook(HookPoint::AfterStep, [state](StepContext& context) {
    context.metrics.emplace_back("amp_precast_tensors", static_cast<double>(std::exchange(state->served, 0)));
  });
}

}  // namespace strata::amp
