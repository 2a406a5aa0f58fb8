// The supervisor of `strata run -n N`: it starts the ranks under mpirun, and when they fail (a
// rank killed by a signal, crashed, or exiting non-zero) restarts all of them from the newest
// checkpoint, up to [job] max_restarts with doubling backoff. Bad input (exit status 2) and
// Ctrl-C stop it at once. Every start, failure and restart goes to events.jsonl in the run
// directory, and the end of the run reports its goodput: the time of the steps it kept over the
// wall time.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

namespace strata::cli {

// One attempt: the ranks' exit status and, for a failure, what mpirun said about it.
struct AttemptResult {
  int status = 0;
  std::string cause;  // "rank 1 exited on signal 9 (Killed)", or empty
  bool interrupted = false;  // Ctrl-C
  std::string hang_ranks;    // after a hang: a JSON array of every rank's last progress
};

// Watches the ranks' progress files (strata/core/progress.h) while an attempt runs. When every
// rank has reported once and then no rank's progress moves for the deadline, it names the ranks
// furthest behind (the others wait for them in a collective) and kills every rank (SIGKILL works
// on a stopped process too), so the attempt ends and the supervisor can restart it. Deadline:
// `timeout_s`, or when 0 the larger of 60 s and 10 x the slowest step seen.
class HangWatch {
 public:
  HangWatch(std::filesystem::path dir, int ranks, double timeout_s);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;
  // Stops watching; then, if a hang was declared, says so in `result`.
  void finish(AttemptResult& result);

 private:
  void watch();
  std::filesystem::path dir_;
  int ranks_;
  double timeout_s_;
  std::atomic<bool> stop_{false};
  std::string cause_, detail_;
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
};

// Runs `mpirun -np ranks` on this program with the same arguments but -n (and with `resume`,
// --resume instead of --overwrite), watching for hangs (`hang_timeout` as [job] hang_timeout),
// and returns how the attempt ended. Errors the ranks report are printed once (cmd_run.cpp).
AttemptResult run_under_mpirun(int argc, char** argv, int64_t ranks, bool resume, int attempt, double hang_timeout);

// Runs attempt(resume, n, ranks) until it succeeds or may not be retried; attempt 0 runs as
// asked, later ones resume. Returns the exit status for `strata run`.
int supervise(const SupervisorOptions& options, const std::function<AttemptResult(bool resume, int attempt, int64_t ranks)>& attempt);

}  // namespace strata::cli
