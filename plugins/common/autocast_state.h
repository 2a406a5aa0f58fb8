// The autocast state a recomputation in backward must run under, shared by the bundled passes
// that recompute a forward there (act_checkpoint's blocks, context_parallel's ring attention):
// autograd runs backward with autocast off, so a forward recomputed there would otherwise run in
// other dtypes than the one it replays. Header-only and internal to the bundled plugins: nothing
// here is part of the plugin ABI.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace strata::autocast_state {

// Restores a device's autocast switch and dtype when it goes out of scope, and drops the casts
// autocast cached meanwhile: they hold parameter values the next optimizer step makes stale.
class Restore {
 public:
  explicit Restore(c10::DeviceType device)
      : device_(device), enabled_(at::autocast::is_autocast_enabled(device)), dtype_(at::autocast::get_autocast_dtype(device)) {}
  ~Restore() {
    at::autocast::set_autocast_enabled(device_, enabled_);
    at::autocast::set_autocast_dtype(device_, dtype_);
    at::autocast::clear_cache();
  }
  Restore(const Restore&) = delete;
  Restore& operator=(const Restore&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  at::ScalarType dtype_;
};

// Keeps the forward's autocast state in an autograd node ...
inline void save(torch::autograd::AutogradContext* ctx, c10::DeviceType device) {
  ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
  ctx->saved_data["autocast_dtype"] = at::autocast::get_autocast_dtype(device);
}

// ... and puts it back in backward, for as long as the returned guard lives.
class Replay {
 public:
  Replay(torch::autograd::AutogradContext* ctx, c10::DeviceType device) : outside_(device) {
    at::autocast::set_autocast_enabled(device, ctx->saved_data["autocast"].toBool());
    at::autocast::set_autocast_dtype(device, ctx->saved_data["autocast_dtype"].toScalarType());
  }

 private:
  Restore outside_;
};

}  // namespace strata::autocast_state
