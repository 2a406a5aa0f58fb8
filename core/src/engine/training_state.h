// The state a checkpoint carries (model, optimizer, data position, RNG) as core registers it in
// the job, and how one rank saves and restores its share of it under any layout.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "checkpoint/checkpoint.h"
#include "sampler.h"
#include "strata/core/strategy.h"
#include "strata/job.h"

namespace strata::engine {

// Stateful adaptors for the pieces core owns ("model" before passes apply, the rest after).
std::shared_ptr<Stateful> model_state(std::shared_ptr<nn::Model> model);
std::shared_ptr<Stateful> buffer_state(std::shared_ptr<nn::Model> model);  // its buffers (none: an empty state)
std::shared_ptr<Stateful> optimizer_state(Optimizer& optimizer, const nn::Model& model);
std::shared_ptr<Stateful> data_state(BatchSampler& sampler);
std::shared_ptr<Stateful> rng_state();

struct SavedState {
  NamedTensors tensors;
  Placements placements;
};

// What this rank writes (as the tensors are, on their device: a flash snapshot copies them
// straight into shared memory, a disk save through for_disk). A tensor (or piece) that every
// data rank holds alike is written by one of them, so replicas write no byte twice; they are
// shared out by bytes (largest first, each to the data rank with the fewest bytes so far, the
// same on every rank), since a snapshot or save waits for the rank with the most. Pieces sharded
// over the data ranks and per-rank state (the RNG) are written by their own rank, pieces of split
// experts by one rank of those holding them.
SavedState gather_state(const Job& job);

// The tensors on the CPU, each with a storage of its own (pieces of one flat buffer share one;
// a safetensors file needs each apart).
NamedTensors for_disk(const NamedTensors& tensors);

// Every state asks the checkpoint for exactly the tensors (and pieces) it saves itself, so a
// checkpoint saved by any number of ranks under any layout loads here. A checkpoint that passed
// its checksums but cannot be read (a damaged shard under a manifest rewritten to match it)
// loads nothing on any rank: the ranks agree before loading, and `problem` says what failed.
bool restore_state(const Job& job, const Checkpoint& checkpoint, int rank, std::string& problem,
                   const std::function<void()>& heartbeat = {});

// Identifies what shapes the saved state and the sequence of batches: a resume with another
// model, data or optimizer is refused. Ranks, parallel layout, passes, steps, logging, paths
// ([data] path, [model] init_from) and the learning-rate schedule and clipping ([optimizer] lr,
// schedule, warmup_steps, min_lr_ratio, decay_fraction, decay_shape, grad_clip, weight_decay)
// may change, and a key at its default counts as absent (a key a later Strata adds keeps older
// checkpoints resumable); state a pass keeps is checked when it loads.
std::string state_hash(const ResolvedStrategy& plan);
// The hashes a disk checkpoint holding this plan's state may carry: state_hash; the one Strata
// computed until 2026-12-01, with the schedule's keys; and the one until 2026-11-30, over every
// key the run's `saved_strategy` (its strategy.toml, read before this run rewrites it) names, with
// the paths absolute or as the working directory names them.
std::set<std::string> accepted_state_hashes(const ResolvedStrategy& plan, const std::filesystem::path& saved_strategy);
// The keys of that identity whose values differ from those in `saved_strategy` (a strategy.toml
// Strata wrote), each as "section.key = there, here"; empty when the file is missing.
std::vector<std::string> state_differences(const ResolvedStrategy& plan, const std::filesystem::path& saved_strategy);
// The schedule keys a resume changes against `saved_strategy`, each as "optimizer.lr = 0.001
// (0.002 before)", for the note that says so.
std::vector<std::string> schedule_changes(const ResolvedStrategy& plan, const std::filesystem::path& saved_strategy);

// Bytes held in model states, each storage counted once (views of one flat buffer, parameters
// freed between uses), and the process's peak resident memory.
struct MemoryFigures {
  double params = 0, grads = 0, optimizer = 0, peak = 0;  // peak: the process's resident set
  double device_peak = 0;  // the allocator's peak of live tensor bytes on the device (on the CPU: counting_cpu_allocator.h)
};
MemoryFigures memory_figures(const Job& job);

}  // namespace strata::engine
