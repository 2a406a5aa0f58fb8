// Wires flat units into a training job: any registered optimizer runs on this rank's pieces of
// the parameters, checkpoints save those pieces as slices, clipping sees the gradient chunks,
// and backward reports each parameter whose gradient is final.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "flat_unit.h"
#include "strata/job.h"

namespace strata::sharding {

using Units = std::vector<std::shared_ptr<FlatUnit>>;

// Whether `unit` is one of `units` (by identity).
bool holds(const Units& units, const FlatUnit& unit);

// Whether a parameter (by name) is a piece of experts split by expert_parallel (placed over
// Dim::Expert): replicated only over the data ranks that hold the same experts, so it is
// broadcast, reduced and sharded over Topology::expert_data_group, not the data group. `model`
// may be an outline (its absent blocks keep their placements).
std::function<bool(const std::string&)> split_expert_predicate(const nn::Model& model);

// Broadcasts parameters from rank 0 of `data` (split experts from rank 0 of `expert_data`) and,
// with `buffers`, buffers from rank 0 of `data`, so replicas start equal. Placeholders (what a
// sharded build left of the parameters it kept a chunk of: nn::placeholder) hold nothing to send.
void broadcast_model_state(nn::Model& model, Communicator& data, Communicator& expert_data, bool buffers = true);

// Replaces the job's optimizer construction, its "model" state and its local gradients with
// sharded ones. The units must hold every trainable parameter between them. Returns what the
// optimizer steps' all-gathers have moved since (as refresh_all counts it), for the pass to
// report and reset.
std::shared_ptr<Traffic> shard_training_state(Job& job, const Units& units);

// Calls `ready(unit, param)` each time backward has accumulated a parameter's gradient, once the
// unit has adopted it (FlatUnit::adopt_gradient).
void on_gradient_accumulated(const Units& units, std::function<void(size_t unit, size_t param)> ready);

// The units' gradient buffers live for one step: released as each step's first forward starts
// (FlatUnit::release_gradients), so the forward holds no gradients from the step before.
void release_gradients_before_each_step(Job& job, const Units& units);

// The `unused_parameters` key ddp, zero and fsdp share ("error" or "ignore"), and its check
// at the end of a backward that reduces: unless ignored, parameters that got no gradient are an
// error naming them.
Schema add_unused_parameters_key(Schema schema);
bool ignores_unused_parameters(const Config& config);
void check_unused_parameters(const std::string& pass, bool ignore, const Units& units);

// Launches every unit's refresh (all-gather of the updated chunk), then waits for them all.
// Returns what the gathers moved (FlatUnit::gather_traffic).
Traffic refresh_all(const Units& units);

}  // namespace strata::sharding
