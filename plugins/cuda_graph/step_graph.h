// One piece of device work recorded once as a CUDA graph and replayed: every kernel, copy and
// allocation it made, launched again with one call, with the same pointers. A replay reads its
// inputs from where the capture read them and leaves its outputs where the capture left them, so
// whoever replays copies new inputs into those tensors first and keeps the outputs' tensors alive.
#pragma once

#include <functional>
#include <memory>

#include <c10/core/Device.h>

namespace strata::cuda_graph {

class StepGraph {
 public:
  // Runs `work` once under stream capture on a side stream of `device` (its kernels are recorded,
  // not run); what it allocates comes from a memory pool of the graph's own, which no other work
  // uses while the graph lives. Throws UserError naming `what` if the work cannot be captured
  // (it waits for the device, or calls what a capture forbids).
  StepGraph(c10::Device device, const std::function<void()>& work, const std::string& what);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Launches the recorded work on the device's current stream.
  void replay() const;

 private:
  struct Handles;
  std::unique_ptr<Handles> handles_;
};

}  // namespace strata::cuda_graph
