// Sharded initialisation for fsdp: a rank keeps only its chunk of each unit as the model is built.
//
// Every rank runs the model factory from the same generator state, so each block draws exactly the
// values of the single-process model. fsdp lays each unit's parameters end to end in one flat
// buffer padded to a multiple of the data ranks, and rank r keeps chunk r of it (flat_unit.h).
// The units are planned on the model's outline (fsdp_units.h: names, types, shapes, before any
// value is drawn), so the moment the factory adds a block, ShardKeeper knows where each of its
// parameters falls in its unit's buffer: it copies the part inside this rank's chunk and turns the
// parameter into a placeholder (nn::placeholder: its shape over one element). A rank's start-up peak is then its chunks plus
// the one block being drawn, where it was the whole model (torchtitan reaches the same by building
// on the meta device and initialising each shard; Megatron-FSDP initialises layer by layer).
// apply() builds each unit from its kept chunk (FlatUnit's kept_chunk constructor).
// Under expert parallel the outline holds this rank's experts only (core builds it so) and its
// absent blocks keep their placements, so the split experts are known before anything is drawn:
// each unit's go to its companion unit, chunked over the expert-data ranks as apply() shards it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp_units.h"
#include "strata/comm.h"
#include "strata/nn.h"

namespace strata::fsdp {

// One unit's layout: its name and its parameters (full name, elements) in buffer order. Under
// expert parallel a run's split experts form a companion unit, "<name>.experts", sharded over the
// expert-data ranks (the data ranks holding the same experts) instead of the shard group.
struct UnitLayout {
  std::string name;
  std::vector<std::pair<std::string, int64_t>> params;
  bool experts = false;
  bool operator==(const UnitLayout&) const = default;
};

// The units fsdp builds, in order (wrapped runs that have parameters, then the root), each
// followed by its split experts' companion where `split_expert` names any of its parameters.
std::vector<UnitLayout> unit_layouts(const UnitPlan& plan, const std::function<bool(const std::string&)>& split_expert);

// The ranks a unit's flat buffer is chunked over and this rank's position among them.
struct ChunkGroup {
  int64_t ranks, rank;
};

class ShardKeeper final : public nn::BuildKeeper {
 public:
  // Dense units are chunked over `shard`, expert companions over `experts` (under HSDP, `hybrid`:
  // the expert-data ranks of this rank's shard group).
  ShardKeeper(std::vector<UnitLayout> units, ChunkGroup shard, ChunkGroup experts, bool hybrid = false);
  void built(size_t index, const std::string& name, nn::Block& block) override;
  std::string summary() const override;
  // Whether `unit` is laid out exactly as planned on the outline.
  bool planned(const UnitLayout& unit) const;
  // A pass between the build and fsdp may have changed the units (added a parameter, as LoRA
  // does): every planned unit not among `built` gets its parameters' whole values back, its
  // chunks all-gathered one unit at a time over `shard` (an expert companion over `experts`), so
  // apply() builds it as for a whole model.
  void restore_changed_units(const std::vector<UnitLayout>& built, const std::map<std::string, at::Tensor>& params,
                             Communicator& shard, Communicator& experts, c10::Device device);
  // This rank's chunk of unit `unit` (planned(unit) must hold), once every block is built; zeros
  // where no parameter lies (padding).
  at::Tensor take_chunk(const UnitLayout& unit);

 private:
  struct Slot {
    size_t unit;
    int64_t offset;  // of the parameter's first element in the unit's flat buffer
  };
  std::vector<UnitLayout> units_;
  std::map<std::string, Slot> slots_;
  std::vector<int64_t> chunk_, chunk_begin_, ranks_;  // per unit
  std::vector<at::Tensor> chunks_;
  int64_t shard_ranks_, expert_ranks_, kept_ = 0, seen_ = 0;
  bool hybrid_;
};

}  // namespace strata::fsdp
