// Optimizers: they update parameters from their .grad(). Every piece of their state is a named
// tensor, so checkpoints (and sharding passes) handle any optimizer the same way.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/component.h"
#include "strata/placement.h"

namespace strata {

struct ParamGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  double weight_decay = 0.0;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class STRATA_API Optimizer {
 public:
  virtual ~Optimizer();
  // One update with learning rate `lr`; parameters without a gradient are skipped.
  virtual void step(double lr) = 0;
  // The optimizer's state, by stable names. A checkpoint saves these and loading copies values
  // back into the same tensors, so they must exist from construction on.
  virtual NamedTensors state_tensors() = 0;
  // Placements of state_tensors() that are pieces of larger tensors (a sharding pass's
  // optimizer, a tensor-parallel layer's state); the others are whole.
  virtual Placements state_placements() { return {}; }
};

// ABI 1.4. An optimizer that can gate its update on a flag on the device, found by dynamic_cast:
// step_unless(lr, skip) is step(lr) where the one-element tensor `skip` is 0 and changes nothing
// (parameters, state, step counts) where it is nonzero, without the host reading `skip` on a
// device (a flag in host memory, on the CPU, may be branched on). Core calls it instead of step()
// when a pass registered a skip flag (StepProgram::add_skip_flag): amp's fp16 non-finite check
// then never drains the GPU's queue.
class STRATA_API GatedOptimizer {
 public:
  virtual ~GatedOptimizer();
  virtual void step_unless(double lr, const at::Tensor& skip) = 0;
};

// Whether a GatedOptimizer may branch on `skip` (host memory: the CPU) rather than take its
// device path. STRATA_GATE_ON_DEVICE=1 takes the device path on the CPU too: how CI, which has no
// GPU, runs it. Inline (no symbol): the bundled optimizers' one rule.
inline bool gate_flag_on_host(const at::Tensor& skip) {
  static const bool forced = [] {
    const char* value = std::getenv("STRATA_GATE_ON_DEVICE");
    return value != nullptr && std::string(value) == "1";
  }();
  return skip.is_cpu() && !forced;
}

// The rule that places optimizer state which follows its parameters: a state tensor named
// "<parameter>.<slot>" and shaped like that parameter as `params` holds it (a piece, for a
// sharding pass) is placed as the parameter is in `placements`; the rest (step counters) are
// whole. Parameters without a placement, or undefined in `params`, place nothing.
STRATA_API Placements state_placements_by_parameter(const NamedTensors& state, const std::map<std::string, at::Tensor>& params,
                                                    const Placements& placements);

class STRATA_API OptimizerFactory : public Component {
 public:
  using Component::Component;
  ~OptimizerFactory() override;
  // `config` is the whole [optimizer] section, core's common keys included.
  virtual std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const Config& config) const = 0;
};

}  // namespace strata
