// Optimizers: they update parameters from their .grad(). Every piece of their state is a named
// tensor, so checkpoints (and sharding passes) handle any optimizer the same way.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/component.h"

namespace strata {

struct ParamGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  double weight_decay = 0.0;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Where a saved tensor sits in the whole tensor of the same name, for state a pass shards.
// Two levels, as sharding nests: first a rectangular block of the whole tensor (a tensor-parallel
// shard: rows or columns of a weight; `block_start`/`block_size` per dimension, empty = the whole
// tensor), then elements [offset, offset + numel) of the block's row-major flattening (a flat
// shard: zero, fsdp). Checkpoints record it, so state saved under one sharding loads under any
// other, block or flat.
struct Slice {
  std::vector<int64_t> shape;  // of the whole tensor
  int64_t offset = 0;
  std::vector<int64_t> block_start, block_size;
};
// By tensor name; a name without an entry is a whole tensor.
using Slices = std::map<std::string, Slice>;

class STRATA_API Optimizer {
 public:
  virtual ~Optimizer();
  // One update with learning rate `lr`; parameters without a gradient are skipped.
  virtual void step(double lr) = 0;
  // The optimizer's state, by stable names. A checkpoint saves these and loading copies values
  // back into the same tensors, so they must exist from construction on.
  virtual NamedTensors state_tensors() = 0;
  // Slices of state_tensors() that are pieces of larger tensors (a sharding pass's optimizer).
  virtual Slices state_slices() { return {}; }
};

class STRATA_API OptimizerFactory : public Component {
 public:
  using Component::Component;
  ~OptimizerFactory() override;
  // `config` is the whole [optimizer] section, core's common keys included.
  virtual std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const Config& config) const = 0;
};

}  // namespace strata
