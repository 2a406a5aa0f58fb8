// Trainer::load (strata/core/trainer.h): the newest state every rank can restore. A flash
// snapshot in shared memory comes first when it is at least as new as the newest disk checkpoint
// and every image of it passes its checksum; then disk checkpoints, newest first, an older one
// standing in for a damaged newer one.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>

#include <ATen/ATen.h>

#include "fault_injection.h"
#include "trainer_impl.h"
#include "training_state.h"
#include "strata/core/log.h"
#include "strata/core/process_memory.h"
#include "strata/errors.h"
#include "strata/core/statistics.h"

namespace strata {

namespace {

// A flash snapshot as the ranks agreed on it: its step and world, and for each of that world's
// ranks the current rank that holds its image in its node's store: the rank of the same number
// when it does (its own memory), else the lowest (a replica, [job] snapshot_replicas).
struct AgreedSnapshot {
  int64_t step = -1, world = 0;
  std::vector<int64_t> holder;
  std::vector<int64_t> missing_somewhere;  // 1: some rank's node lacks that image
};

// Whether `image` is one of the images of `snapshot` (saved under `hash`).
bool part_of(const FlashImageRef& image, const AgreedSnapshot& snapshot, const std::string& hash) {
  return image.info.step == snapshot.step && image.info.world_size == snapshot.world && image.info.state_hash == hash && image.rank >= 0 &&
         image.rank < snapshot.world;
}

// The newest snapshot, not older than `disk_step` and saved under `hash`, whose every image some
// rank's node holds (its own, or a replica of another node's). Candidates come newest first from
// every node's store: the one whose rank 0 was lost may still be whole in replicas.
AgreedSnapshot agree_on_snapshot(const std::vector<FlashImageRef>& local, int64_t disk_step, const std::string& hash, Communicator& world,
                                 c10::Device device) {
  const int64_t none = world.size();
  int64_t below = std::numeric_limits<int64_t>::max();
  // A store keeps two snapshots of each rank it holds: a few candidates, newest first, suffice.
  for (int tries = 0; tries < 4; ++tries) {
    // The newest step below `below` some node holds an image of, and the world that saved it.
    int64_t step = -1, saved_world = 0;
    for (const auto& image : local)
      if (image.info.state_hash == hash && image.info.step >= disk_step && image.info.step < below && image.info.step > step)
        step = image.info.step;
    at::Tensor newest = at::tensor(step, at::kLong).to(device);
    world.all_reduce(newest, ReduceOp::Max)->wait();
    step = newest.cpu().item<int64_t>();
    if (step < 0) return {};
    for (const auto& image : local)
      if (image.info.state_hash == hash && image.info.step == step) saved_world = std::max(saved_world, image.info.world_size);
    at::Tensor worlds = at::tensor(saved_world, at::kLong).to(device);
    world.all_reduce(worlds, ReduceOp::Max)->wait();
    AgreedSnapshot snapshot{step, worlds.cpu().item<int64_t>(), {}, {}};
    below = step;
    std::vector<int64_t> holder(static_cast<size_t>(snapshot.world), none), missing(static_cast<size_t>(snapshot.world), 1);
    for (const auto& image : local)
      if (part_of(image, snapshot, hash))
        holder[static_cast<size_t>(image.rank)] = image.rank == world.rank() ? -1 : world.rank(), missing[static_cast<size_t>(image.rank)] = 0;
    at::Tensor holders = at::tensor(holder, at::kLong).to(device), lacking = at::tensor(missing, at::kLong).to(device);
    world.all_reduce(holders, ReduceOp::Min)->wait();
    world.all_reduce(lacking, ReduceOp::Max)->wait();
    holders = holders.cpu(), lacking = lacking.cpu();
    snapshot.holder.assign(holders.data_ptr<int64_t>(), holders.data_ptr<int64_t>() + snapshot.world);
    for (int64_t q = 0; q < snapshot.world; ++q)
      if (snapshot.holder[static_cast<size_t>(q)] == -1) snapshot.holder[static_cast<size_t>(q)] = q;  // its owner, in its own memory
    snapshot.missing_somewhere.assign(lacking.data_ptr<int64_t>(), lacking.data_ptr<int64_t>() + snapshot.world);
    if (std::find(snapshot.holder.begin(), snapshot.holder.end(), none) == snapshot.holder.end()) return snapshot;
  }
  return {};
}

// Every image of the agreed snapshot: mapped from this node's store where it is there, else
// broadcast over `world` by the rank that holds it (every rank takes part in each broadcast some
// rank needs). restore_state reads a replicated tensor from the one data rank that wrote it, and
// that rank may be on another node. Counts the bytes received in `received`.
struct GatheredImages {
  std::vector<std::string_view> images;
  std::shared_ptr<const void> keep_alive;
  uint64_t received = 0;
};
GatheredImages gather_flash_images(const std::vector<FlashImageRef>& local, const AgreedSnapshot& snapshot, const std::string& hash,
                                   Communicator& world, c10::Device device) {
  std::vector<std::filesystem::path> slots;
  std::vector<int> saved_ranks;
  for (const auto& image : local)
    if (part_of(image, snapshot, hash))
      slots.push_back(image.slot), saved_ranks.push_back(image.rank);
  const MappedFlashSet mapped = map_flash_slots(slots);
  std::vector<std::string_view> images(static_cast<size_t>(snapshot.world));
  for (size_t i = 0; i < saved_ranks.size(); ++i) images[static_cast<size_t>(saved_ranks[i])] = mapped.images[i];
  auto received = std::make_shared<std::vector<at::Tensor>>();
  GatheredImages out;
  for (int64_t q = 0; q < snapshot.world; ++q) {
    if (snapshot.missing_somewhere[static_cast<size_t>(q)] == 0) continue;
    const int root = static_cast<int>(snapshot.holder[static_cast<size_t>(q)]);
    at::Tensor size = at::tensor(static_cast<int64_t>(world.rank() == root ? images[static_cast<size_t>(q)].size() : 0), at::kLong).to(device);
    world.broadcast(size, root)->wait();
    const int64_t bytes = size.cpu().item<int64_t>();
    at::Tensor buffer = world.rank() == root
                            ? at::from_blob(const_cast<char*>(images[static_cast<size_t>(q)].data()), {bytes}, at::kByte).to(device, false, true)
                            : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    world.broadcast(buffer, root)->wait();
    if (!images[static_cast<size_t>(q)].empty()) continue;  // this node has it already
    received->push_back(buffer.cpu());
    images[static_cast<size_t>(q)] = {static_cast<const char*>(received->back().data_ptr()), static_cast<size_t>(bytes)};
    out.received += static_cast<uint64_t>(bytes);
  }
  out.images = std::move(images);
  out.keep_alive = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<std::vector<at::Tensor>>>>(mapped.mappings, received);
  return out;
}

}  // namespace

// A flash snapshot across nodes: each node's store holds the images of its own ranks. The ranks
// agree on the newest snapshot whose every image some node holds, the holder of each image checks
// its checksum, and images a node lacks come over the communicator (gather_flash_images).
int64_t Trainer::Impl::restore_flash(std::string& problem) {
  Impl& t = *this;
  Communicator& world = t.topology->world();
  const std::vector<FlashImageRef> local = flash_images(t.flash_dir);
  const int64_t disk_step = t.newest ? t.newest->meta().step : 0;
  const std::string hash = engine::state_hash(t.plan);
  const AgreedSnapshot snapshot = agree_on_snapshot(local, disk_step, hash, world, t.device);
  if (snapshot.step < 0) {
    bool newer = false;
    for (const auto& image : local) newer = newer || (image.info.state_hash == hash && image.info.step > disk_step);
    if (newer) t.console->message("no flash snapshot newer than disk has every image in some node's memory (a node was lost?); loading from disk");
    return 0;
  }
  const std::string label = "the flash snapshot of step " + std::to_string(snapshot.step);
  // The holder of each image checks its checksum; the flags say which failed.
  at::Tensor bad = at::zeros({snapshot.world}, at::kInt);
  for (const auto& image : local)
    if (part_of(image, snapshot, hash) && snapshot.holder[static_cast<size_t>(image.rank)] == t.env.rank && flash_slot_problem(image.slot))
      bad[image.rank] = 1;
  bad = bad.to(t.device);
  world.all_reduce(bad, ReduceOp::Max)->wait();
  const at::Tensor bad_ranks = bad.cpu().nonzero();
  std::optional<GatheredImages> gathered;
  if (bad_ranks.numel() == 0) {
    int failed = 0;
    try {
      gathered = gather_flash_images(local, snapshot, hash, world, t.device);
    } catch (const UserError& e) {
      failed = 1;
      problem = e.what();
    }
    at::Tensor any = at::tensor(failed, at::kInt).to(t.device);
    world.all_reduce(any, ReduceOp::Max)->wait();
    if (any.cpu().item<int>() != 0) gathered.reset(), problem = problem.empty() ? "another rank cannot map it" : problem;
  } else {
    problem = "the snapshot of rank " + std::to_string(bad_ranks[0][0].item<int64_t>()) + " at step " + std::to_string(snapshot.step) +
              " fails its checksum";
  }
  if (gathered) {
    const engine::Checkpoint memory = engine::Checkpoint::from_images({snapshot.step, hash, snapshot.world}, label, gathered->images,
                                                                      gathered->keep_alive);
    if (engine::restore_state(*t.job, memory, t.env.rank, problem)) {
      // Where this rank's own image came from: its node's memory, or a replica on another node.
      const std::vector<int64_t> node_of = engine::nodes_of_ranks(world, t.env.node, t.device);
      const int64_t holder = snapshot.world == t.env.world_size ? snapshot.holder[static_cast<size_t>(t.env.rank)] : t.env.rank;
      flash_peer_node = node_of[static_cast<size_t>(holder)] != t.env.node ? static_cast<int>(node_of[static_cast<size_t>(holder)]) : -1;
      const std::string peers =
          gathered->received > 0 ? "; " + std::to_string(gathered->received) + " bytes of other nodes' images received over the communicator" : "";
      t.console->message("resumed from " + label + " in shared memory (" + std::to_string(snapshot.world) + " ranks saved it" + peers + ")");
      log::record("flash restore: step " + std::to_string(snapshot.step) + peers);
      return snapshot.step;
    }
  }
  t.console->message("skipping " + label + ": " + problem + "; loading from disk");
  return 0;
}

void Trainer::Impl::find_checkpoints() {
  checkpoints_found = true;
  skipped.clear();
  newest.reset();
  older = engine::checkpoint_dirs_newest_first(checkpoints_dir);
  while (!newest && !older.empty()) {
    newest = engine::open_checkpoint_or_explain(older.front(), skipped, engine::Checkpoint::Checksums::Deferred);
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
  // The supervisor may still be writing the failed attempt's newest snapshot to disk (persist at
  // breakpoint, overlapped with this start-up): wait for it, then look at disk again.
  if (const char* flash_root = std::getenv("STRATA_FLASH_DIR"); t.flash && flash_root) {
    if (wait_for_breakpoint_persist(flash_root, t.plan.job.get_float("start_timeout"))) {
      t.checkpoints_found = false;
      log::record("waited " + std::to_string(seconds_since(restore_started)) + " s for the supervisor's persist at the breakpoint");
    }
  }
  // The set-up's search when it is fresh (the constructor's resume), else a new one.
  if (!t.checkpoints_found) t.find_checkpoints();
  t.checkpoints_found = false;
  int64_t restored = 0;
  if (t.flash) {
    std::string problem;
    restored = t.restore_flash(problem);
    if (restored > 0) {
      memory.record("a flash snapshot");
      t.progress->set_restore(seconds_since(restore_started), t.flash_peer_node >= 0 ? RestoreSource::PeerMemory : RestoreSource::Memory,
                              restored, t.flash_peer_node);
      t.continue_from(restored);
      return true;
    }
  }
  const bool any = t.newest.has_value();
  // Each 4 MiB hashed and each tensor read is a beat: a large checkpoint's checksums and restore,
  // on slow storage, are progress to the hang watch, not a silent start-up.
  const auto restoring = [&t] {
    t.progress->beat();
    engine::inject_fault(t.env.rank, 0, "restore");
  };
  while (t.newest) {
    std::string problem;
    // Every rank runs each step of this loop for the same checkpoint: the checksums (each rank
    // hashing its share of the files) and the restore agree across the ranks.
    if (!t.accepted_hashes.count(t.newest->meta().state_hash))
      problem = "saved with another model, data or optimizer configuration";
    else if (auto bad = engine::checksum_problem_together(*t.newest, t.topology->world(), t.device, restoring))
      problem = *bad;
    else if (engine::restore_state(*t.job, *t.newest, t.env.rank, problem, restoring))
      break;
    t.skipped.push_back("checkpoint " + t.newest->path().string() + ": " + problem);
    t.newest.reset();
    while (!t.newest && !t.older.empty()) {
      t.newest = engine::open_checkpoint_or_explain(t.older.front(), t.skipped, engine::Checkpoint::Checksums::Deferred);
      t.older.erase(t.older.begin());
    }
  }
  for (const auto& reason : t.skipped) t.console->message("skipping " + reason);
  if (any && !t.newest) throw UserError("no checkpoint in " + t.checkpoints_dir.string() + " could be restored (see the lines above)");
  if (!t.newest) {
    t.console->message("no valid checkpoint in " + t.checkpoints_dir.string() + "; starting from step 0");
    t.progress->set_restore(seconds_since(restore_started), RestoreSource::None, 0);  // the supervisor's resumed step
    t.continue_from(0);
    return false;
  }
  const engine::CheckpointMeta meta = t.newest->meta();
  t.progress->set_restore(seconds_since(restore_started), RestoreSource::Disk, meta.step);
  memory.record(t.newest->path().string());
  t.console->message("resumed from " + t.newest->path().string() + " at step " + std::to_string(meta.step) +
                     (meta.world_size != t.env.world_size ? " (saved by " + std::to_string(meta.world_size) + " ranks)" : std::string()));
  t.newest.reset(), t.older.clear(), t.skipped.clear();
  t.continue_from(meta.step);
  return true;
}

}  // namespace strata
