#include "tune_trial.h"

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

#include "common.h"

namespace strata::cli {

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

}  // namespace

TrialResult run_trial(const std::filesystem::path& strategy, const std::filesystem::path& run_dir, const TrialSettings& s) {
  TrialResult result;
  const std::filesystem::path log = run_dir.string() + ".log";
  std::vector<std::string> argv{"strata", "run", strategy.string(), "-n", std::to_string(s.ranks), "--out", run_dir.string(), "--overwrite",
                                "--set", "job.steps=" + std::to_string(s.warmup_steps + s.measured_steps),
                                "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0", "--set", "job.flash_every=0",
                                "--set", "job.max_restarts=0", "--set", "job.log_every=1000"};
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    result.verdict = "could not start: fork failed";
    return result;
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own process group, so a timeout kills mpirun and every rank
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv("/proc/self/exe", args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (seconds_since(start) > s.timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.wall_s = seconds_since(start);
  if (timed_out) {
    result.verdict = "timed out after " + std::to_string(static_cast<int>(s.timeout_s)) + " s";
    return result;
  }
  if (WIFSIGNALED(status)) {
    result.verdict = "killed by signal " + std::to_string(WTERMSIG(status)) + " (out of memory?)";
    return result;
  }
  if (WEXITSTATUS(status) != 0) {
    result.verdict = "exit status " + std::to_string(WEXITSTATUS(status)) + ": " + last_error_line(log);
    return result;
  }
  std::vector<double> step_ms;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.contains("step")) continue;
    if (record.value("step", 0) > s.warmup_steps) step_ms.push_back(record.value("step_ms", 0.0));
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

}  // namespace strata::cli
