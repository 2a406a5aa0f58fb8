// Trainer::load (strata/core/trainer.h): the newest state every rank can restore. A flash
// snapshot in shared memory comes first when it is at least as new as the newest disk checkpoint
// and every image of it passes its checksum; then disk checkpoints, newest first, an older one
// standing in for a damaged newer one.
#include <chrono>

#include <ATen/ATen.h>

#include "trainer_impl.h"
#include "training_state.h"
#include "strata/core/log.h"
#include "strata/core/process_memory.h"
#include "strata/errors.h"
#include "strata/core/statistics.h"

namespace strata {

int64_t Trainer::Impl::restore_flash(std::string& problem) {
  Impl& t = *this;
  const auto sets = complete_flash_sets(t.flash_dir);
  const int64_t disk_step = t.newest ? t.newest->meta().step : 0;
  const std::string hash = engine::state_hash(t.plan);
  const FlashSet* set = !sets.empty() && sets.front().info.step >= disk_step && sets.front().info.state_hash == hash ? &sets.front() : nullptr;
  at::Tensor agreed = at::tensor(std::vector<int64_t>{set ? set->info.step : -1, set ? -set->info.step : 1}, at::kLong).to(t.device);
  t.topology->world().all_reduce(agreed, ReduceOp::Max)->wait();
  agreed = agreed.cpu();
  if (!set || agreed[0].item<int64_t>() != -agreed[1].item<int64_t>()) return 0;
  // Each rank checks every world_size-th image; the flags say which failed.
  at::Tensor bad = at::zeros({static_cast<int64_t>(set->slots.size()) + 1}, at::kInt);  // last: cannot map
  for (size_t r = static_cast<size_t>(t.env.rank); r < set->slots.size(); r += static_cast<size_t>(t.env.world_size))
    if (flash_slot_problem(set->slots[r])) bad[static_cast<int64_t>(r)] = 1;
  std::optional<MappedFlashSet> mapped;
  try {
    mapped = map_flash_set(*set);
  } catch (const UserError& e) {
    bad[static_cast<int64_t>(set->slots.size())] = 1;
    problem = e.what();
  }
  bad = bad.to(t.device);
  t.topology->world().all_reduce(bad, ReduceOp::Max)->wait();
  const at::Tensor bad_ranks = bad.cpu().nonzero();
  if (bad_ranks.numel() > 0 && bad_ranks[0][0].item<int64_t>() == static_cast<int64_t>(set->slots.size()))
    problem = problem.empty() ? "another rank cannot map it" : problem;
  else if (bad_ranks.numel() > 0)
    problem = "the snapshot of rank " + std::to_string(bad_ranks[0][0].item<int64_t>()) + " at step " + std::to_string(set->info.step) +
              " fails its checksum";
  if (bad_ranks.numel() == 0) {
    const engine::Checkpoint memory = engine::Checkpoint::from_images(
        {set->info.step, set->info.state_hash, set->info.world_size}, "the flash snapshot of step " + std::to_string(set->info.step),
        mapped->images, mapped->mappings);
    if (engine::restore_state(*t.job, memory, t.env.rank, problem)) {
      t.console->message("resumed from the flash snapshot of step " + std::to_string(set->info.step) + " in shared memory (" +
                         std::to_string(set->info.world_size) + " ranks saved it)");
      return set->info.step;
    }
  }
  t.console->message("skipping the flash snapshot of step " + std::to_string(set->info.step) + ": " + problem + "; loading from disk");
  return 0;
}

void Trainer::Impl::find_checkpoints() {
  checkpoints_found = true;
  skipped.clear();
  newest.reset();
  older = engine::checkpoint_dirs_newest_first(checkpoints_dir);
  while (!newest && !older.empty()) {
    newest = engine::open_checkpoint_or_explain(older.front(), skipped);
    older.erase(older.begin());
  }
}

namespace {

// The rank log's record of what restoring state cost in memory: a rank reads only the elements of
// its own pieces from the checkpoint's files (mapped, engine/checkpoint.cpp), so its peak should
// rise by about its share of the model states, not by whole files.
struct RestoreMemory {
  double resident_before = (release_free_memory(), resident_bytes()), peak_before = peak_resident_bytes();
  void record(const std::string& from) const {
    const auto mib = [](double bytes) { return std::to_string(static_cast<int64_t>(bytes / (1 << 20))); };
    log::record("state restored from " + from + ": resident " + mib(resident_bytes()) + " MiB, peak " + mib(peak_resident_bytes()) +
                " MiB (" + mib(resident_before) + " MiB before the restore, peak " + mib(peak_before) + " MiB)");
  }
};

}  // namespace

bool Trainer::load() {
  Impl& t = *impl_;
  const auto restore_started = std::chrono::steady_clock::now();
  const RestoreMemory memory;
  // The set-up's search when it is fresh (the constructor's resume), else a new one.
  if (!t.checkpoints_found) t.find_checkpoints();
  t.checkpoints_found = false;
  int64_t restored = 0;
  if (t.flash) {
    std::string problem;
    restored = t.restore_flash(problem);
    if (restored > 0) {
      memory.record("a flash snapshot");
      t.progress->set_restore(seconds_since(restore_started), RestoreSource::Memory);
      t.continue_from(restored);
      return true;
    }
  }
  const bool any = t.newest.has_value();
  const std::string hash = engine::state_hash(t.plan);
  while (t.newest) {
    std::string problem;
    if (t.newest->meta().state_hash != hash)
      problem = "saved with another model, data or optimizer configuration";
    else if (engine::restore_state(*t.job, *t.newest, t.env.rank, problem))
      break;
    t.skipped.push_back("checkpoint " + t.newest->path().string() + ": " + problem);
    t.newest.reset();
    while (!t.newest && !t.older.empty()) {
      t.newest = engine::open_checkpoint_or_explain(t.older.front(), t.skipped);
      t.older.erase(t.older.begin());
    }
  }
  for (const auto& reason : t.skipped) t.console->message("skipping " + reason);
  if (any && !t.newest) throw UserError("no checkpoint in " + t.checkpoints_dir.string() + " could be restored (see the lines above)");
  if (!t.newest) {
    t.console->message("no valid checkpoint in " + t.checkpoints_dir.string() + "; starting from step 0");
    t.continue_from(0);
    return false;
  }
  t.progress->set_restore(seconds_since(restore_started), RestoreSource::Disk);
  memory.record(t.newest->path().string());
  const engine::CheckpointMeta meta = t.newest->meta();
  t.console->message("resumed from " + t.newest->path().string() + " at step " + std::to_string(meta.step) +
                     (meta.world_size != t.env.world_size ? " (saved by " + std::to_string(meta.world_size) + " ranks)" : std::string()));
  t.newest.reset(), t.older.clear(), t.skipped.clear();
  t.continue_from(meta.step);
  return true;
}

}  // namespace strata
