// Snapshots of the random number generators a computation on one device draws from, so a pass
// can run a computation again with the same random numbers (dropout masks).
#pragma once

#include <mutex>
#include <vector>

#include <ATen/Context.h>

namespace strata {

class RngSnapshot {
 public:
  // The CPU generator's state, and the device's own generator's when `device` is not the CPU.
  explicit RngSnapshot(const c10::Device& device) : generators_(generators_of(device)) {
    for (auto& generator : generators_) states_.push_back(generator.get_state());
  }
  // A snapshot from states() taken earlier on the same device.
  RngSnapshot(const c10::Device& device, std::vector<at::Tensor> states)
      : generators_(generators_of(device)), states_(std::move(states)) {}

  const std::vector<at::Tensor>& states() const { return states_; }
  // Puts every generator back to the captured state.
  void restore() const {
    for (size_t i = 0; i < generators_.size(); ++i) {
      at::Generator generator = generators_[i];  // a handle: the copy sets the shared generator
      generator.set_state(states_[i]);
    }
  }

  // The generators a computation on `device` draws from: the CPU's, and the device's own.
  static std::vector<at::Generator> generators_of(const c10::Device& device) {
    std::vector<at::Generator> out{at::globalContext().defaultGenerator(c10::Device(c10::kCPU))};
    if (!device.is_cpu()) out.push_back(at::globalContext().defaultGenerator(device));
    return out;
  }

 private:
  std::vector<at::Generator> generators_;
  std::vector<at::Tensor> states_;
};

// Seeds every generator a computation on `device` draws from.
inline void seed_generators(const c10::Device& device, uint64_t seed) {
  for (auto& generator : RngSnapshot::generators_of(device)) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed);
  }
}

}  // namespace strata
