#include "supervisor.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "strata/core/progress.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

// The newest step metrics.jsonl records, and the sum of its steps' step_ms: what the run keeps
// (a resume truncates the file to the steps before the checkpoint it restarts from).
struct MetricsSummary {
  int64_t last_step = 0;
  double kept_ms = 0;
};

double number_after(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  return at == std::string::npos ? NAN : std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

MetricsSummary read_metrics(const fs::path& run_dir) {
  MetricsSummary out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const double step = number_after(line, "step"), ms = number_after(line, "step_ms");
    if (!std::isnan(step)) out.last_step = static_cast<int64_t>(step);
    if (!std::isnan(ms)) out.kept_ms += ms;
  }
  return out;
}

// The step of the newest checkpoint directory (checkpoints/step_NNNNNNNN), or 0.
int64_t newest_checkpoint_step(const fs::path& run_dir) {
  int64_t newest = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir / "checkpoints", ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) newest = std::max<int64_t>(newest, std::atoll(name.c_str() + 5));
  }
  return newest;
}

class EventLog {
 public:
  explicit EventLog(const fs::path& path) : out_(path, std::ios::app) {}
  void write(const std::string& event, int attempt, const std::string& fields) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::ostringstream line;
    line.precision(15);
    line << "{\"time\":" << now << ",\"event\":\"" << event << "\",\"attempt\":" << attempt << fields << "}\n";
    out_ << line.str() << std::flush;
  }

 private:
  std::ofstream out_;
};

// The one rank a failure's cause blames ("rank 3 exited on signal 9", "...; rank 3 behind at
// step 5"), or -1.
int blamed_rank(const std::string& cause) {
  static const std::regex one_rank("(^|; )rank ([0-9]+) ");
  std::smatch match;
  return std::regex_search(cause, match, one_rank) ? std::stoi(match[2]) : -1;
}

}  // namespace

HangWatch::HangWatch(fs::path dir, int ranks, double timeout_s) : dir_(std::move(dir)), ranks_(ranks), timeout_s_(timeout_s) {
  thread_ = std::thread([this] { watch(); });
}

HangWatch::~HangWatch() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void HangWatch::finish(AttemptResult& result) {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (cause_.empty()) return;
  result.cause = cause_;
  result.hang_ranks = detail_;
  if (result.status == 0) result.status = 1;
}

void HangWatch::watch() {
  std::vector<ProgressRecord> last(static_cast<size_t>(ranks_));
  std::vector<Clock::time_point> changed(static_cast<size_t>(ranks_), Clock::now());
  std::vector<bool> seen(static_cast<size_t>(ranks_), false);
  Clock::time_point newest_change = Clock::now(), step_started = Clock::now();
  int64_t lowest_step = -1;
  double slowest_step = 0;
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int r = 0; r < ranks_; ++r) {
      ProgressRecord now;
      if (!read_progress(dir_, r, now)) continue;
      auto& before = last[static_cast<size_t>(r)];
      if (!seen[static_cast<size_t>(r)] || now.beats != before.beats) {
        seen[static_cast<size_t>(r)] = true;
        changed[static_cast<size_t>(r)] = newest_change = Clock::now();
      }
      before = now;
    }
    if (std::find(seen.begin(), seen.end(), false) != seen.end()) continue;  // still starting
    int64_t low = last[0].step;
    for (const auto& p : last) low = std::min(low, p.step);
    if (low != lowest_step) {  // every rank is past a step: how long steps take
      if (lowest_step >= 0) slowest_step = std::max(slowest_step, seconds_since(step_started));
      lowest_step = low;
      step_started = Clock::now();
    }
    bool finished = true;
    for (const auto& p : last) finished = finished && p.phase == static_cast<int32_t>(StepPhase::Finished);
    if (finished) continue;
    const double deadline = timeout_s_ > 0 ? timeout_s_ : std::max(60.0, 10.0 * slowest_step);
    const double idle = seconds_since(newest_change);
    if (idle < deadline) continue;
    // A hang: the ranks furthest behind are the culprits, unless every rank is at the same point.
    auto position = [](const ProgressRecord& p) { return std::make_pair(p.step, p.phase); };
    auto behind = position(last[0]), ahead = position(last[0]);
    for (const auto& p : last) behind = std::min(behind, position(p)), ahead = std::max(ahead, position(p));
    std::string culprits, detail = "[";
    for (int r = 0; r < ranks_; ++r) {
      const auto& p = last[static_cast<size_t>(r)];
      if (position(p) == behind && behind != ahead) culprits += (culprits.empty() ? "" : ", ") + std::to_string(r);
      std::ostringstream one;
      one.precision(3);
      one << (r ? "," : "") << "{\"rank\":" << r << ",\"pid\":" << p.pid << ",\"step\":" << p.step << ",\"phase\":"
          << json_string(step_phase_name(static_cast<StepPhase>(p.phase))) << ",\"idle_s\":" << seconds_since(changed[static_cast<size_t>(r)])
          << "}";
      detail += one.str();
    }
    detail += "]";
    std::ostringstream cause;
    cause.precision(3);
    cause << "hang: no rank made progress for " << idle << " s (deadline " << deadline << " s); ";
    if (culprits.empty())
      cause << "every rank stopped at step " << behind.first << ", " << step_phase_name(static_cast<StepPhase>(behind.second));
    else
      cause << "rank" << (culprits.find(',') == std::string::npos ? " " : "s ") << culprits << " behind at step " << behind.first << ", "
            << step_phase_name(static_cast<StepPhase>(behind.second)) << "; the others wait at step " << ahead.first << ", "
            << step_phase_name(static_cast<StepPhase>(ahead.second));
    cause_ = cause.str();
    detail_ = detail;
    for (const auto& p : last)
      if (p.pid > 0) ::kill(p.pid, SIGKILL);
    return;
  }
}

int supervise(const SupervisorOptions& options, const std::function<AttemptResult(bool resume, int attempt, int64_t ranks)>& attempt) {
  const auto started = Clock::now();
  EventLog events(options.run_dir / "events.jsonl");
  int64_t restarts = 0, recomputed_steps = 0, ranks = options.ranks;
  int previously_blamed = -1;
  double recovery_seconds = 0;
  for (int n = 0;; ++n) {
    events.write("start", n, (n == 0 ? std::string() : std::string(",\"resume\":true")) + ",\"ranks\":" + std::to_string(ranks));
    const AttemptResult result = attempt(n > 0, n, ranks);
    if (result.status == 0) {
      const MetricsSummary kept = read_metrics(options.run_dir);
      const double wall = seconds_since(started), goodput = wall > 0 ? kept.kept_ms / 1000.0 / wall : 0.0;
      std::ostringstream fields;
      fields.precision(6);
      fields << ",\"step\":" << kept.last_step << ",\"restarts\":" << restarts << ",\"recomputed_steps\":" << recomputed_steps
             << ",\"wall_s\":" << wall << ",\"kept_step_s\":" << kept.kept_ms / 1000.0 << ",\"recovery_s\":" << recovery_seconds
             << ",\"goodput\":" << goodput;
      events.write("finish", n, fields.str());
      if (restarts > 0) {
        std::ostringstream line;
        line.precision(3);
        line << "strata: finished after " << restarts << " restart" << (restarts > 1 ? "s" : "") << "; goodput " << goodput
             << " (kept steps " << kept.kept_ms / 1000.0 << " s of " << wall << " s wall; " << recomputed_steps
             << " steps recomputed, " << recovery_seconds << " s restarting)";
        std::cerr << line.str() << "\n";
      }
      return 0;
    }
    const MetricsSummary reached = read_metrics(options.run_dir);
    const int64_t checkpoint = newest_checkpoint_step(options.run_dir);
    const std::string cause = result.interrupted ? "interrupted (Ctrl-C)"
                              : !result.cause.empty() ? result.cause
                                                      : "ranks exited with status " + std::to_string(result.status);
    std::ostringstream fields;
    fields << ",\"cause\":" << json_string(cause) << ",\"status\":" << result.status << ",\"step_reached\":" << reached.last_step
           << ",\"checkpoint_step\":" << checkpoint << ",\"steps_lost\":" << std::max<int64_t>(0, reached.last_step - checkpoint);
    if (!result.hang_ranks.empty()) events.write("hang", n, ",\"ranks\":" + result.hang_ranks);
    events.write("failure", n, fields.str());
    // Bad input fails the same way again; Ctrl-C means stop. Both leave a resumable run.
    if (result.status == 2 || result.interrupted || n >= options.max_restarts) {
      if (options.max_restarts > 0 && n >= options.max_restarts && result.status != 2 && !result.interrupted)
        std::cerr << "strata: error: giving up after " << n << " restart" << (n == 1 ? "" : "s") << " ([job] max_restarts = "
                  << options.max_restarts << "); last failure: " << cause << "; resume with --resume\n";
      // 2 (bad input) stays 2; any other failure (mpirun's 128 + signal included) is 1.
      return result.status == 2 ? 2 : 1;
    }
    const int blamed = blamed_rank(cause);
    if (blamed >= 0 && blamed == previously_blamed && options.min_ranks > 0 && ranks - 1 >= options.min_ranks) {
      std::cerr << "strata: rank " << blamed << " failed in two attempts in a row; continuing on " << ranks - 1 << " ranks\n";
      events.write("shrink", n,
                   ",\"from\":" + std::to_string(ranks) + ",\"to\":" + std::to_string(ranks - 1) + ",\"excluded_rank\":" + std::to_string(blamed));
      --ranks;
      previously_blamed = -1;
    } else {
      previously_blamed = blamed;
    }
    const auto failed_at = Clock::now();
    const double backoff = std::min(60.0, options.backoff_seconds * std::pow(2.0, static_cast<double>(n)));
    std::cerr << "strata: " << cause << " at step " << reached.last_step << "; restarting all ranks from "
              << (checkpoint > 0 ? "the checkpoint of step " + std::to_string(checkpoint) : std::string("step 0")) << " in "
              << backoff << " s (restart " << n + 1 << " of " << options.max_restarts << ")\n";
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    ++restarts;
    recomputed_steps += std::max<int64_t>(0, reached.last_step - checkpoint);
    recovery_seconds += seconds_since(failed_at);
  }
}

}  // namespace strata::cli
