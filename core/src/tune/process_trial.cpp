// ProcessTrialRunner (strata/core/tune_trials.h): a trial is `strata run` in fresh processes, in
// its own process group, so a candidate that runs out of memory, crashes or hangs costs the tune
// only that trial: the group is killed at the timeout and the verdict says why. Its step time and
// peak memory are read back from the run's metrics.jsonl, as a user's run writes them.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "strata/core/statistics.h"
#include "strata/core/tune_trials.h"

namespace strata {
namespace {

// The last line of the trial's log that says "error", or its last line.
std::string last_error_line(const std::filesystem::path& log) {
  std::ifstream in(log);
  std::string line, last, error;
  while (std::getline(in, line))
    if (!line.empty()) {
      last = line;
      if (line.find("error") != std::string::npos) error = line;
    }
  return error.empty() ? last : error;
}

// Starts `argv` with its output in `log`; its exit status, or -1 with `verdict` set when it was
// killed (by a signal or at `timeout_s`).
int run_process(const std::filesystem::path& executable, std::vector<std::string> argv, const std::filesystem::path& log, double timeout_s,
                std::string& verdict) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    verdict = "could not start: fork failed";
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own process group, so a timeout kills mpirun and every rank
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(executable.c_str(), args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (seconds_since(start) > timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      verdict = "timed out after " + std::to_string(static_cast<int>(timeout_s)) + " s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (WIFSIGNALED(status)) {
    verdict = "killed by signal " + std::to_string(WTERMSIG(status)) + " (out of memory?)";
    return -1;
  }
  return WEXITSTATUS(status);
}

}  // namespace

ProcessTrialRunner::ProcessTrialRunner(std::filesystem::path strata_executable, std::filesystem::path out_dir, int64_t ranks,
                                       int64_t warmup_steps, int64_t measured_steps)
    : strata_executable_(std::move(strata_executable)),
      out_dir_(std::move(out_dir)),
      ranks_(ranks),
      warmup_steps_(warmup_steps),
      measured_steps_(measured_steps) {}

TrialResult ProcessTrialRunner::run(const TuneCandidate& candidate, size_t rank, int64_t round) {
  const std::string name = "candidate-" + std::to_string(rank);
  const std::filesystem::path strategy = out_dir_ / (name + ".toml");
  if (round == 1) {
    const std::string choices = other_choices(candidate);
    std::ofstream(strategy) << raw_strategy_toml(candidate.raw, "# strata tune candidate " + std::to_string(rank) + ": " + candidate.layout +
                                                                    "; " + (choices.empty() ? "-" : choices) + "\n");
  }
  const std::filesystem::path run_dir = out_dir_ / (round == 1 ? name : name + "-round" + std::to_string(round));
  const std::filesystem::path log = run_dir.string() + ".log";
  const int64_t steps = warmup_steps() + measured_steps();
  std::vector<std::string> argv{"strata", "run", strategy.string(), "-n", std::to_string(ranks_), "--out", run_dir.string(), "--overwrite"};
  for (const std::string& set : trial_overrides(steps)) argv.insert(argv.end(), {"--set", set});
  const double timeout_s = std::max(120.0, 20 * candidate.predicted_s * static_cast<double>(steps));
  TrialResult result;
  const auto start = std::chrono::steady_clock::now();
  const int status = run_process(strata_executable_, argv, log, timeout_s, result.verdict);
  result.wall_s = seconds_since(start);
  if (status < 0) return result;
  if (status != 0) {
    result.verdict = "exit status " + std::to_string(status) + ": " + last_error_line(log);
    return result;
  }
  std::vector<double> step_ms;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.contains("step")) continue;
    if (record.value("step", 0) > warmup_steps()) step_ms.push_back(record.value("step_ms", 0.0));
    result.peak_bytes = std::max(result.peak_bytes, record.value("mem_peak_bytes", 0.0));
  }
  if (step_ms.empty()) {
    result.verdict = "no measured steps in " + (run_dir / "metrics.jsonl").string();
    return result;
  }
  result.step_s = median(step_ms) / 1000.0;
  result.ok = true;
  result.verdict = "ok";
  return result;
}

}  // namespace strata
