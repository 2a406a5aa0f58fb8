// The supervisor of `strata run -n N`: it starts the ranks under mpirun, and when they fail (a
// rank killed by a signal, crashed, or exiting non-zero) restarts all of them from the newest
// checkpoint, up to [job] max_restarts with doubling backoff. Bad input (exit status 2) stops it
// at once; Ctrl-C or SIGTERM stops the ranks after one agreed step, saved (StopRelay). Every start, failure and restart goes to events.jsonl in the run
// directory, and the end of the run reports its goodput: the time of the steps it kept over the
// wall time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace strata {
struct ProgressRecord;
}

namespace strata::cli {

// One attempt: the ranks' exit status and, for a failure, what mpirun said about it.
struct AttemptResult {
  int status = 0;
  std::string cause;  // "rank 1 exited on signal 9 (Killed)", or empty
  bool interrupted = false;  // Ctrl-C
  bool cause_shown = false;  // the ranks' own error lines were on the terminal (the cause is one of them)
  std::string hang_ranks;    // after a hang: a JSON array of every rank's last progress
  std::string flight_record; // after a hang: every rank's last collectives (flight_record_json)
  // For the goodput breakdown, from the ranks' progress records: the most any rank spent blocked
  // in checkpoints, and loading the checkpoint it resumed from (and where from); the time no rank
  // moved before a hang was declared.
  double checkpoint_s = 0, replica_s = 0, restore_s = 0, hang_s = 0;
  int restored_from = 0;  // RestoreSource
  // Where each rank's state came from (RestoreSource, by rank), the step the ranks resumed from,
  // and the seconds from the attempt's start until every rank began its first step (-1: never).
  std::vector<int> restored_by_rank, restored_peer_node;
  int64_t resumed_step = 0;
  double first_step_s = -1;
  // The newest step any rank finished (its optimizer update done), from the progress records: a
  // rank killed by a signal cannot write the metrics lines of the steps it has not read yet
  // ([job] log_every), so metrics.jsonl may stop short of it.
  int64_t step_finished = 0;
};

// How one attempt runs (run_under_mpirun).
struct AttemptOptions {
  int64_t ranks = 1;
  bool resume = false;
  int attempt = 0;
  double hang_timeout = 0;    // [job] hang_timeout
  double start_timeout = 600; // [job] start_timeout
  std::string flash_dir;      // STRATA_FLASH_DIR for the ranks; empty: no flash checkpoints
  std::vector<int> slots;     // STRATA_SLOTS for the ranks (strata/core/launch_env.h); empty: the default
};

// One rank's figures and verdict from the health check (`strata doctor`, cmd_doctor.cpp).
struct RankHealth {
  int rank = 0, slot = 0;
  std::string verdict;  // "ok", "straggler" or "faulty"
  double gflops = 0, pair_gbps = 0;
  std::string reason;
};
// Runs `strata doctor` on one rank per slot; throws when it does not report every rank.
std::vector<RankHealth> check_health(const std::vector<int>& slots);

// Watches the ranks' progress files (strata/core/progress.h) while an attempt runs. When no
// rank's progress moves for the deadline, it names the collective some ranks wait in and the
// ranks that never issued it, from the flight records (strata/core/flight_recorder.h), or else
// the ranks furthest behind in their step, and kills every rank (SIGKILL works on a stopped process too), so the
// attempt ends and the supervisor can restart it. Deadline: `timeout_s`, or when 0 the larger of
// 60 s and 10 x the slowest step seen; while any rank is starting up (or has not reported at
// all: those are named), `start_timeout_s`. Ranks are found as the children of `launcher_pid`.
class HangWatch {
 public:
  HangWatch(std::filesystem::path dir, int ranks, double timeout_s, double start_timeout_s, int launcher_pid);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;
  // Stops watching; then, if a hang was declared, says so in `result`.
  void finish(AttemptResult& result);

 private:
  void watch();
  void describe_hang(const std::vector<ProgressRecord>& last, const std::vector<std::chrono::steady_clock::time_point>& changed, double idle,
                     double deadline);
  std::filesystem::path dir_;
  int ranks_;
  double timeout_s_, start_timeout_s_;
  int launcher_pid_;
  double hang_s_ = 0;
  std::atomic<double> first_step_s_{-1};
  std::atomic<int64_t> first_step_{0};
  std::atomic<bool> stop_{false};
  std::string cause_, detail_, flight_record_;
  std::thread thread_;
};

// A Ctrl-C or SIGTERM to `strata run -n N` stops the run gracefully. The ranks run in a process
// group of their own, so the terminal's Ctrl-C reaches the supervisor alone, which counts signals
// in `signals`. At the first, every rank is asked through its progress file (request_stop) to
// stop once one step more than the furthest rank had begun is done, save a checkpoint and exit:
// the ranks agree on that step without a collective. A rank still starting up has nothing to
// save: they are asked once all have started. A second signal sends the launcher's process
// group SIGTERM (mpirun then ends the ranks).
class StopRelay {
 public:
  StopRelay(std::filesystem::path dir, int ranks, int launcher_pid, const volatile int& signals);
  ~StopRelay();
  StopRelay(const StopRelay&) = delete;
  StopRelay& operator=(const StopRelay&) = delete;

 private:
  void relay();
  std::filesystem::path dir_;
  int ranks_, launcher_pid_;
  const volatile int& signals_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct SupervisorOptions {
  std::filesystem::path run_dir;
  int64_t max_restarts = 0;
  double backoff_seconds = 1.0;
  int64_t ranks = 1;
  // Elastic world size: when the same rank fails in two attempts in a row and one rank fewer is
  // still at least min_ranks (0: never), the next attempts run on one rank fewer, resuming the
  // checkpoint resharded (the global batch and the sample order do not depend on the world size).
  int64_t min_ranks = 0;
  // Simulated nodes (strata run --simulate-nodes K; 0: none): K nodes of contiguous ranks, each
  // with its own flash store. A node whose ranks failed and whose store is gone was lost; lost in
  // two attempts in a row, it does not come back: the next attempts run without its ranks, on
  // K - 1 nodes (ranks - ranks/K >= min_ranks), as a job whose host is gone. The remaining
  // stores are renumbered so that node k's ranks keep finding theirs.
  int64_t simulated_nodes = 0;
  // Flash checkpoints ([job] flash_every > 0): the shared-memory directory the ranks snapshot
  // into; empty when off. The supervisor persists every checkpoint_every-th snapshot (keeping
  // keep_checkpoints), and the newest at every failure and at the end.
  std::filesystem::path flash_dir;
  int64_t checkpoint_every = 0, keep_checkpoints = 3;
  bool persist_at_end = true;  // [job] checkpoint_at_end: the newest snapshot goes to disk when the run ends well
  bool first_attempt_resumes = false;  // --resume: snapshots a killed supervisor left are kept
  double persist_pause = 0;            // fault injection: STRATA_FAULT "slow_persist SECONDS"
  // [job] health_check: "off", "report", "exclude" (faulty slots), "exclude_stragglers"; run
  // through check_health before every start. Excluding needs min_ranks > 0 and enough left.
  std::string health_check = "off";
  std::function<std::vector<RankHealth>(const std::vector<int>& slots)> check_health = strata::cli::check_health;
};

// Runs `mpirun -np ranks` on this program with the same arguments but -n (and with `resume`,
// --resume instead of --overwrite), watching for hangs, and returns how the attempt ended.
// Errors the ranks report are printed once (cmd_run.cpp).
AttemptResult run_under_mpirun(int argc, char** argv, const AttemptOptions& options);

// Runs attempt(resume, n, slots) until it succeeds or may not be retried; attempt 0 runs as
// asked, later ones resume. `slots`: one device slot per rank (strata/core/launch_env.h), all
// of 0..ranks-1 at first; the health check and the elastic shrink leave slots out. Returns the exit status for `strata run`.
int supervise(const SupervisorOptions& options,
              const std::function<AttemptResult(bool resume, int attempt, const std::vector<int>& slots)>& attempt);

}  // namespace strata::cli
