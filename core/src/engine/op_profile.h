// Per-operator time of training steps ([job] profile_steps): which ATen operators and autograd
// nodes the steps spend their time in, to decide what to fuse. Self time, as torch.profiler's
// "self CPU": an operator's time minus that of the operators it called. On a GPU the host's time
// says what was queued, not what ran, so the kernels' own times are recorded too (libtorch's
// Kineto profiler with CUPTI, as torch.profiler's "self CUDA").
#pragma once

#include <filesystem>
#include <string>

namespace strata::engine {

class OpProfile {
 public:
  OpProfile() = default;
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Records operators between start() and stop() (and with `device_kernels`, the kernels that
  // ran on an accelerator); `step_ms` adds a profiled step's wall time. stop() after the
  // device has finished the profiled steps' work (a read of their figures waits for it).
  void start(bool device_kernels = false);
  void stop();
  void add_step(double step_ms);
  // A Markdown table, operators by self time, with each one's share of the profiled steps.
  void write(const std::filesystem::path& file, const std::string& title) const;

 private:
  bool running_ = false, kernels_running_ = false;
  uint64_t handle_ = 0;
  int64_t steps_ = 0;
  double step_ms_ = 0;
};

}  // namespace strata::engine
