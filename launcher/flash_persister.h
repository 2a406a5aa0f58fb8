// The supervisor's half of flash checkpoints (strata/core/flash_checkpoint.h): while an attempt
// runs, a background thread writes every checkpoint_every-th snapshot the ranks put in shared
// memory to the run's checkpoints directory; when an attempt ends, by failure or success, the
// newest snapshot not yet on disk is written before anything else happens ("persist at
// breakpoint"), so `latest` on disk is never behind what a restart may load from memory. At the
// end of the run the shared memory is removed.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace strata::cli {

// The step of the newest checkpoint directory of a run (checkpoints/step_NNNNNNNN), or 0: what
// is on disk, which the persister does not write again and the supervisor reports.
int64_t newest_checkpoint_step(const std::filesystem::path& run_dir);

class FlashPersister {
 public:
  // `log(event, fields)` appends to events.jsonl (fields start with a comma); `pause_seconds`
  // (fault injection, STRATA_FAULT "slow_persist SECONDS") is slept inside every persist.
  FlashPersister(std::filesystem::path flash_dir, std::filesystem::path checkpoints_dir, int64_t every, int64_t keep,
                 std::function<void(const std::string&, const std::string&)> log, double pause_seconds);
  ~FlashPersister();
  FlashPersister(const FlashPersister&) = delete;
  FlashPersister& operator=(const FlashPersister&) = delete;

  // Background persisting for the duration of one attempt.
  void start();
  void stop();  // waits for a persist in flight
  // Writes the newest snapshot newer than disk that passes its checksums (an older one when the
  // newest does not); `when` names the occasion in events.jsonl. False when a snapshot newer than
  // disk exists but none of them could be written.
  bool persist_newest(const std::string& when);
  // The same on a thread of its own, the marker file (breakpoint_persist_marker) present while it
  // runs: the next attempt starts meanwhile and its ranks wait for it only before restoring.
  void persist_newest_in_background(const std::string& when);
  void wait_for_breakpoint();  // joins that thread
  // The step that thread is writing: the newest complete snapshot newer than disk (or disk's
  // step), before its checksums are checked; a damaged image makes the persist fall back to an
  // older set, and the restart names the step it actually resumed (events.jsonl `recovered`).
  int64_t breakpoint_step() const { return breakpoint_step_; }
  int64_t persisted_step() const { return persisted_; }
  double seconds_spent() const { return seconds_; }
  // Deletes the run's shared memory.
  void remove();
  // The most bytes each node's store held at once (its own images' two slots and the replicas it
  // keeps for other nodes), by store name ("node_0", ...), as sampled about once a second while
  // attempts ran and at their ends: the memory snapshots cost each node.
  std::map<std::string, uint64_t> peak_store_bytes() const;

 private:
  // Persists the newest set newer than disk whose step `eligible` accepts; false if one failed.
  bool persist_one(const std::string& when, const std::function<bool(int64_t)>& eligible);
  void measure_stores();
  std::filesystem::path flash_dir_, checkpoints_dir_;
  int64_t every_, keep_;
  std::function<void(const std::string&, const std::string&)> log_;
  double pause_seconds_;
  std::atomic<int64_t> persisted_{0};
  int64_t breakpoint_step_ = 0;
  std::atomic<double> seconds_{0};
  std::atomic<bool> stop_{false};
  std::mutex persisting_;  // one persist at a time
  std::set<int64_t> failed_;  // steps whose set could not be written (not retried)
  mutable std::mutex measuring_;
  std::map<std::string, uint64_t> peak_store_bytes_;
  std::thread thread_, breakpoint_;
};

}  // namespace strata::cli
