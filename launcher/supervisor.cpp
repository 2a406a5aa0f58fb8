#include "supervisor.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "flash_persister.h"
#include "strata/core/flash_checkpoint.h"
#include "strata/core/flight_recorder.h"
#include "strata/core/launch_env.h"
#include "strata/core/progress.h"
#include "strata/core/statistics.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


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
  std::vector<std::pair<int64_t, double>> step_ms;  // every step's time
  // The time of the steps after `step` up to `reached`; steps past the last recorded one (not
  // written before a kill) count at the mean of the recorded ones.
  double ms_after(int64_t step, int64_t reached) const {
    double sum = 0, all = 0;
    for (const auto& [s, ms] : step_ms) sum += s > step ? ms : 0, all += ms;
    const int64_t unrecorded = reached - std::max(step, last_step);
    if (unrecorded > 0 && !step_ms.empty()) sum += static_cast<double>(unrecorded) * all / static_cast<double>(step_ms.size());
    return sum;
  }
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
    if (!std::isnan(step) && !std::isnan(ms)) out.step_ms.emplace_back(static_cast<int64_t>(step), ms);
  }
  return out;
}

class EventLog {
 public:
  explicit EventLog(const fs::path& path) : out_(path, std::ios::app) {}
  // Thread-safe: the flash persister writes from its own thread.
  void write(const std::string& event, int attempt, const std::string& fields) {
    const std::lock_guard<std::mutex> one_line_at_a_time(mutex_);
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::ostringstream line;
    line.precision(15);
    line << "{\"time\":" << now << ",\"event\":\"" << event << "\",\"attempt\":" << attempt << fields << "}\n";
    out_ << line.str() << std::flush;
  }

 private:
  std::mutex mutex_;
  std::ofstream out_;
};

// The one rank a failure's cause blames ("rank 3 exited on signal 9", "...; rank 3 behind at
// step 5"), or -1.
int blamed_rank(const std::string& cause) {
  static const std::regex one_rank("(^|; )rank ([0-9]+) ");
  std::smatch match;
  return std::regex_search(cause, match, one_rank) ? std::stoi(match[2]) : -1;
}

// The ranks: children of the launcher (mpirun), from /proc.
std::vector<int> children_of(int parent) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    int ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

}  // namespace

// The step of the newest checkpoint directory (checkpoints/step_NNNNNNNN), or 0.
HangWatch::HangWatch(fs::path dir, int ranks, double timeout_s, double start_timeout_s, int launcher_pid)
    : dir_(std::move(dir)), ranks_(ranks), timeout_s_(timeout_s), start_timeout_s_(start_timeout_s), launcher_pid_(launcher_pid) {
  thread_ = std::thread([this] { watch(); });
}

StopRelay::StopRelay(fs::path dir, int ranks, int launcher_pid, const volatile int& signals)
    : dir_(std::move(dir)), ranks_(ranks), launcher_pid_(launcher_pid), signals_(signals) {
  thread_ = std::thread([this] { relay(); });
}

StopRelay::~StopRelay() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void StopRelay::relay() {
  bool asked = false, waiting = false;
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (signals_ > 1) {
      ::kill(-launcher_pid_, SIGTERM);
      return;
    }
    if (signals_ == 0 || asked) continue;
    // One step past the furthest rank's current one: a rank that had begun it before the
    // request arrived finishes it, and every rank stops after that same step.
    int64_t furthest = 0;
    bool starting = false;
    for (int r = 0; r < ranks_; ++r) {
      ProgressRecord p;
      starting = starting || !read_progress(dir_, r, p) || p.phase == static_cast<int32_t>(StepPhase::StartingUp);
      furthest = std::max(furthest, p.step);
    }
    // Ranks still starting up (building, restoring) are asked once they all run.
    if (starting) {
      if (!waiting) std::cerr << "strata: stopping once every rank has started (Ctrl-C again stops at once)\n";
      waiting = true;
      continue;
    }
    asked = true;
    for (int r = 0; r < ranks_; ++r) request_stop(dir_, r, furthest + 1);
    std::cerr << "strata: stopping: every rank stops after step " << furthest + 1 << " and saves it (Ctrl-C again stops at once)\n";
  }
}

HangWatch::~HangWatch() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void HangWatch::finish(AttemptResult& result) {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  int64_t restored_step = -1;
  for (int r = 0; r < ranks_; ++r) {
    ProgressRecord p;
    if (!read_progress(dir_, r, p)) continue;
    // The slowest rank's checkpoint time, and its replica part.
    if (static_cast<double>(p.checkpoint_ns) * 1e-9 >= result.checkpoint_s)
      result.checkpoint_s = static_cast<double>(p.checkpoint_ns) * 1e-9, result.replica_s = static_cast<double>(p.replica_ns) * 1e-9;
    result.restore_s = std::max(result.restore_s, static_cast<double>(p.restore_ns) * 1e-9);
    result.restored_from = std::max(result.restored_from, static_cast<int>(p.restored_from));
    result.restored_by_rank.push_back(p.restored_from);
    result.restored_peer_node.push_back(p.restored_peer_node);
    const bool updated = p.phase >= static_cast<int32_t>(StepPhase::Updated);
    result.step_finished = std::max(result.step_finished, updated ? p.step : p.step - 1);
    restored_step = std::max(restored_step, p.restored_step);
  }
  result.first_step_s = first_step_s_;
  // The ranks say which step they restored; the lowest step first seen running only estimates it
  // (the watch looks every 100 ms, and a fast job is steps further by then).
  result.resumed_step = restored_step >= 0 ? restored_step : std::max<int64_t>(0, first_step_ - 1);
  if (cause_.empty()) return;
  result.hang_s = hang_s_;
  result.cause = cause_;
  result.hang_ranks = detail_;
  result.flight_record = flight_record_;
  if (result.status == 0) result.status = 1;
}

void HangWatch::watch() {
  std::vector<ProgressRecord> last(static_cast<size_t>(ranks_));
  std::vector<Clock::time_point> changed(static_cast<size_t>(ranks_), Clock::now());
  std::vector<bool> seen(static_cast<size_t>(ranks_), false);
  Clock::time_point newest_change = Clock::now(), step_started = Clock::now(), watch_started = Clock::now();
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
    if (std::find(seen.begin(), seen.end(), false) != seen.end()) {  // still starting
      const double waited = seconds_since(watch_started);
      if (waited < start_timeout_s_) continue;
      std::string missing;
      for (int r = 0; r < ranks_; ++r)
        if (!seen[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      std::ostringstream cause;
      cause.precision(3);
      cause << "hang at start-up: rank" << (missing.find(',') == std::string::npos ? " " : "s ") << missing
            << " did not report within " << waited << " s ([job] start_timeout " << start_timeout_s_ << " s)";
      cause_ = cause.str();
      detail_ = "[]";
      hang_s_ = waited;
      const std::vector<int> ranks = children_of(launcher_pid_);
      for (int pid : ranks) ::kill(pid, SIGKILL);
      if (ranks.empty()) ::kill(launcher_pid_, SIGKILL);  // mpirun itself is stuck before starting them
      return;
    }
    int64_t low = last[0].step;
    for (const auto& p : last) low = std::min(low, p.step);
    if (low != lowest_step) {  // every rank is past a step: how long steps take
      // Intervals that began at start-up (step 0) hold the job's building and restore, not a step.
      if (lowest_step > 0) slowest_step = std::max(slowest_step, seconds_since(step_started));
      lowest_step = low;
      step_started = Clock::now();
    }
    bool started = true;
    for (const auto& p : last) started = started && p.phase != static_cast<int32_t>(StepPhase::StartingUp);
    if (started && first_step_s_ < 0) first_step_ = low, first_step_s_ = seconds_since(watch_started);
    bool finished = true;
    for (const auto& p : last) finished = finished && p.phase == static_cast<int32_t>(StepPhase::Finished);
    if (finished) continue;
    bool starting = false;
    for (const auto& p : last) starting = starting || p.phase == static_cast<int32_t>(StepPhase::StartingUp);
    // With hang_timeout = 0 the deadline scales with the steps seen; until one step has been timed
    // it stays start_timeout: the first step holds the warm-up (allocations, GEMM and attention
    // kernel choices, a CUDA graph's recording) and a large model's first forward on a CPU can take
    // minutes, which a fixed 60 s declared a hang (torchtitan likewise keeps its init timeout until
    // the first step ends).
    const double deadline = starting || (timeout_s_ <= 0 && slowest_step == 0) ? start_timeout_s_
                            : timeout_s_ > 0                                   ? timeout_s_
                                                                               : std::max(60.0, 10.0 * slowest_step);
    const double idle = seconds_since(newest_change);
    if (idle < deadline) continue;
    describe_hang(last, changed, idle, deadline);
    for (const auto& p : last)
      if (p.pid > 0) ::kill(p.pid, SIGKILL);
    return;
  }
}

// The cause of a hang the watch declared: the collective the flight records name when there is
// one; else the ranks furthest behind, unless every rank is at the same point.
void HangWatch::describe_hang(const std::vector<ProgressRecord>& last, const std::vector<std::chrono::steady_clock::time_point>& changed,
                              double idle, double deadline) {
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
        << json_string(step_phase_name(static_cast<StepPhase>(p.phase)));
    if (p.micro >= 0) one << ",\"micro_batch\":" << p.micro << ",\"in\":\"" << (p.micro_backward ? "backward" : "forward") << "\"";
    one << ",\"idle_s\":" << seconds_since(changed[static_cast<size_t>(r)]) << "}";
    detail += one.str();
  }
  detail += "]";
  // The flight records name the collective, when there is one to name.
  std::vector<ProgressFile> files(static_cast<size_t>(ranks_));
  std::vector<bool> present(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) present[static_cast<size_t>(r)] = read_progress_file(dir_, r, files[static_cast<size_t>(r)]);
  const CollectiveDiagnosis collective = diagnose_collectives(files, present);
  flight_record_ = flight_record_json(files, present);
  std::ostringstream cause;
  cause.precision(3);
  cause << "hang: no rank made progress for " << idle << " s (deadline " << deadline << " s); ";
  if (!collective.culprits.empty()) {
    cause << collective.cause;
    for (int r : collective.culprits) {
      const ProgressRecord& p = last[static_cast<size_t>(r)];
      cause << "; rank " << r << " is at step " << p.step << ", " << step_phase_name(static_cast<StepPhase>(p.phase));
      if (p.micro >= 0) cause << " (micro-batch " << p.micro << ", " << (p.micro_backward ? "backward" : "forward") << ")";
    }
  } else {
    if (culprits.empty()) {
      cause << "every rank stopped at step " << behind.first << ", " << step_phase_name(static_cast<StepPhase>(behind.second));
      // Every rank at one point with no collective in flight may be a step slower than the deadline.
      if (collective.cause.empty()) cause << ", with no collective in flight (if a step can take this long, raise [job] hang_timeout)";
    }
    else
      cause << "rank" << (culprits.find(',') == std::string::npos ? " " : "s ") << culprits << " behind at step " << behind.first << ", "
            << step_phase_name(static_cast<StepPhase>(behind.second)) << "; the others wait at step " << ahead.first << ", "
            << step_phase_name(static_cast<StepPhase>(ahead.second));
    if (!collective.cause.empty()) cause << "; " << collective.cause;
  }
  cause_ = cause.str();
  detail_ = detail;
  hang_s_ = idle;
}

namespace {

// Where the wall time of a supervised run went, summed over its attempts (the goodput breakdown).
struct TimeAccount {
  double checkpoint_s = 0;   // ranks blocked in checkpoints (the slowest rank's figure), replicas apart
  double replica_s = 0;      // of the same rank, blocked sending and receiving snapshot replicas
  double reload_s = 0;       // loading the checkpoint restarts resumed from (own memory or disk)
  double peer_reload_s = 0;  // the same for restarts whose state came from replicas in other nodes' memory
  double recomputed_s = 0;   // steps run again after a failure (their first run's step time)
  double hang_s = 0;         // no progress before a hang was declared
  double restart_s = 0;      // from a failure to the next start: persisting at breakpoint, backoff
  double health_check_s = 0; // [job] health_check before the starts
  std::string fields(double wall, double kept) const {
    std::ostringstream out;
    out.precision(6);
    out << ",\"kept_step_s\":" << kept << ",\"checkpoint_blocking_s\":" << checkpoint_s << ",\"replica_blocking_s\":" << replica_s
        << ",\"reload_s\":" << reload_s << ",\"peer_reload_s\":" << peer_reload_s
        << ",\"recomputed_s\":" << recomputed_s << ",\"hang_s\":" << hang_s << ",\"restart_s\":" << restart_s
        << ",\"health_check_s\":" << health_check_s << ",\"other_s\":"
        << std::max(0.0, wall - kept - checkpoint_s - replica_s - reload_s - peer_reload_s - recomputed_s - hang_s - restart_s - health_check_s);
    return out.str();
  }
};

std::string slot_list(const std::vector<int>& slots) {
  std::string out;
  for (int s : slots) {
    if (!out.empty()) out += ",";
    out += std::to_string(s);
  }
  return out;
}

// [job] health_check before a start: runs the doctor on `slots`, records its figures, and with an
// exclude policy leaves the slots it names out. Returns false when the run must stop (a named
// slot may not be left out: min_ranks).
bool check_before_start(const SupervisorOptions& options, int attempt, EventLog& events, std::vector<int>& slots) {
  std::vector<RankHealth> health;
  try {
    health = options.check_health(slots);
  } catch (const std::exception& e) {  // the attempt itself will show what is wrong
    events.write("health", attempt, ",\"error\":" + json_string(e.what()));
    std::cerr << "strata: health check failed (" << e.what() << "); starting anyway\n";
    return true;
  }
  std::ostringstream ranks;
  ranks.precision(4);
  std::vector<int> bad;
  std::string named;
  for (const RankHealth& h : health) {
    ranks << (&h == health.data() ? "" : ",") << "{\"rank\":" << h.rank << ",\"slot\":" << h.slot << ",\"verdict\":\"" << h.verdict
          << "\",\"matmul_gflops\":" << h.gflops << ",\"pair_bus_gbps\":" << h.pair_gbps << "}";
    if (h.verdict == "ok") continue;
    named += (named.empty() ? "" : "; ") + std::string("slot ") + std::to_string(h.slot) + " (rank " + std::to_string(h.rank) +
             ") " + h.verdict + ": " + h.reason;
    if (h.verdict == "faulty" || options.health_check == "exclude_stragglers") bad.push_back(h.slot);
  }
  events.write("health", attempt, ",\"ranks\":[" + ranks.str() + "]");
  if (named.empty()) return true;
  std::cerr << "strata: health check: " << named << "\n";
  if (options.health_check == "report" || bad.empty()) return true;
  const int64_t remaining = static_cast<int64_t>(slots.size() - bad.size());
  if (options.min_ranks == 0 || remaining < options.min_ranks || remaining < 1) {
    std::cerr << "strata: error: the health check names slot" << (bad.size() > 1 ? "s " : " ") << slot_list(bad)
              << ", and [job] min_ranks = " << options.min_ranks << " does not allow starting on " << remaining
              << " ranks; fix or free the slots, or lower min_ranks, and resume with --resume\n";
    events.write("exclude_refused", attempt, ",\"slots\":[" + slot_list(bad) + "],\"min_ranks\":" + std::to_string(options.min_ranks));
    return false;
  }
  std::vector<int> kept;
  for (int s : slots)
    if (std::find(bad.begin(), bad.end(), s) == bad.end()) kept.push_back(s);
  std::cerr << "strata: leaving slot" << (bad.size() > 1 ? "s " : " ") << slot_list(bad) << " out; starting on " << kept.size() << " ranks\n";
  events.write("exclude", attempt,
               ",\"slots\":[" + slot_list(bad) + "],\"from\":" + std::to_string(slots.size()) + ",\"to\":" + std::to_string(kept.size()));
  slots = kept;
  return true;
}

// Flash checkpoints: a fresh run starts without snapshots; a resumed one first writes to disk
// what a supervisor killed before it could left in memory.
void start_flash_persister(std::optional<FlashPersister>& flash, const SupervisorOptions& options, EventLog& events) {
  std::error_code ignored;
  if (!options.first_attempt_resumes) fs::remove_all(options.flash_dir, ignored);
  release_flash_slots(options.flash_dir);
  flash.emplace(options.flash_dir, options.run_dir / "checkpoints", options.checkpoint_every, options.keep_checkpoints,
                [&events](const std::string& event, const std::string& fields) { events.write(event, -1, fields); }, options.persist_pause);
  if (options.first_attempt_resumes) flash->persist_newest("start");
}

// A failed attempt in events.jsonl: its cause and the steps it lost; after a hang, every rank's
// last progress and collectives (flight_record_attempt_N.json), for a reader who wants more than
// the cause's one line.
void record_failure(EventLog& events, int n, const AttemptResult& result, const std::string& cause, int64_t step_reached,
                    int64_t checkpoint, const fs::path& run_dir) {
  std::ostringstream fields;
  fields << ",\"cause\":" << json_string(cause) << ",\"status\":" << result.status << ",\"step_reached\":" << step_reached
         << ",\"checkpoint_step\":" << checkpoint << ",\"steps_lost\":" << std::max<int64_t>(0, step_reached - checkpoint);
  if (!result.hang_ranks.empty()) {
    std::string flight;
    if (!result.flight_record.empty()) {
      const std::string name = "flight_record_attempt_" + std::to_string(n) + ".json";
      std::ofstream(run_dir / name) << result.flight_record << "\n";
      flight = ",\"flight_record\":" + json_string(name);
    }
    events.write("hang", n, ",\"ranks\":" + result.hang_ranks + flight);
  }
  events.write("failure", n, fields.str());
}

// After a restart, where each rank's state came from ("memory": its node's snapshot store, "peer
// node K": a replica in node K's, "disk": the checkpoints directory, "none": step 0), the step resumed, the seconds from the end of
// the failed attempt until every rank began a new step, and the bytes of the disk checkpoint
// loaded (0 from memory): the figures a node loss is measured by.
void record_recovery(EventLog& events, int n, const AttemptResult& result, Clock::time_point failed_at, Clock::time_point started,
                     const fs::path& run_dir) {
  if (result.first_step_s < 0) return;  // no rank got as far as a step
  std::ostringstream fields;
  fields.precision(6);
  fields << ",\"resumed_step\":" << result.resumed_step << ",\"sources\":[";
  bool any_disk = false;
  for (size_t r = 0; r < result.restored_by_rank.size(); ++r) {
    const auto source = static_cast<RestoreSource>(result.restored_by_rank[r]);
    any_disk = any_disk || source == RestoreSource::Disk;
    fields << (r ? "," : "")
           << (source == RestoreSource::Memory       ? "\"memory\""
               : source == RestoreSource::PeerMemory ? "\"peer node " + std::to_string(result.restored_peer_node[r]) + "\""
               : source == RestoreSource::Disk       ? "\"disk\""
                                                     : "\"none\"");
  }
  uint64_t disk_bytes = 0;
  std::error_code ec;
  if (any_disk)
    for (const auto& entry : fs::directory_iterator(run_dir / "checkpoints" / step_dir_name(result.resumed_step), ec))
      if (entry.is_regular_file(ec)) disk_bytes += entry.file_size(ec);
  fields << "],\"disk_checkpoint_bytes\":" << disk_bytes << ",\"failure_to_first_step_s\":"
         << std::chrono::duration<double>(started - failed_at).count() + result.first_step_s;
  events.write("recovered", n, fields.str());
}

// Simulated nodes: ranks per node, as LaunchEnv places them (the last node smaller after a shrink
// by one rank).
int64_t ranks_per_node(size_t ranks, int64_t nodes) { return (static_cast<int64_t>(ranks) + nodes - 1) / nodes; }

// Simulated nodes: the node a failure lost (the blamed rank's node, when its snapshot store is
// gone: lose_node deletes it as a host's death takes its memory), or -1.
int lost_node(int blamed, const SupervisorOptions& options, int64_t nodes, size_t ranks) {
  if (blamed < 0 || nodes <= 0 || options.flash_dir.empty()) return -1;
  const int node = static_cast<int>(blamed / ranks_per_node(ranks, nodes));
  std::error_code ec;
  return fs::exists(flash_node_store(options.flash_dir, node), ec) ? -1 : node;
}

// The elastic path for simulated nodes: a node lost in two attempts in a row is left out, all of
// its ranks (their slots dropped), while at least [job] min_ranks remain; the ranks learn the
// smaller node count from STRATA_SIMULATED_NODES and the stores after it move down one. Returns
// whether it shrank.
bool shrink_if_node_lost_twice(int lost, int& previously_lost, const SupervisorOptions& options, int64_t& nodes, std::vector<int>& slots,
                               EventLog& events, int n, FlashPersister* flash) {
  if (lost < 0) {
    previously_lost = -1;
    return false;
  }
  const int64_t ranks = static_cast<int64_t>(slots.size()), per_node = ranks_per_node(slots.size(), nodes);
  const int64_t first = lost * per_node, end = std::min(ranks, first + per_node), remaining = ranks - (end - first);
  if (lost != previously_lost || options.min_ranks <= 0 || remaining < std::max<int64_t>(1, options.min_ranks)) {
    previously_lost = lost;
    return false;
  }
  std::cerr << "strata: node " << lost << " was lost in two attempts in a row; continuing on " << remaining << " ranks ("
            << nodes - 1 << " node" << (nodes - 1 == 1 ? "" : "s") << ")\n";
  std::string excluded;
  for (int64_t r = first; r < end; ++r) excluded += (excluded.empty() ? "" : ",") + std::to_string(r);
  events.write("shrink", n,
               ",\"from\":" + std::to_string(ranks) + ",\"to\":" + std::to_string(remaining) + ",\"excluded_node\":" +
                   std::to_string(lost) + ",\"excluded_ranks\":[" + excluded + "]");
  slots.erase(slots.begin() + first, slots.begin() + end);
  if (flash) flash->wait_for_breakpoint();  // it reads the stores about to be renumbered
  std::error_code ec;
  for (int64_t k = lost + 1; k < nodes; ++k)
    fs::rename(flash_node_store(options.flash_dir, static_cast<int>(k)), flash_node_store(options.flash_dir, static_cast<int>(k - 1)), ec);
  --nodes;
  ::setenv(kSimulatedNodesEnv, std::to_string(nodes).c_str(), 1);
  previously_lost = -1;
  return true;
}

// The elastic path: a rank blamed for two failures in a row is left out (its device slot
// dropped) while at least [job] min_ranks remain.
void shrink_if_blamed_twice(int blamed, int& previously_blamed, const SupervisorOptions& options, std::vector<int>& slots, EventLog& events,
                            int n) {
  const int64_t ranks = static_cast<int64_t>(slots.size());
  if (blamed < 0 || blamed != previously_blamed || options.min_ranks <= 0 || ranks - 1 < options.min_ranks) {
    previously_blamed = blamed;
    return;
  }
  std::cerr << "strata: rank " << blamed << " failed in two attempts in a row; continuing on " << ranks - 1 << " ranks\n";
  events.write("shrink", n,
               ",\"from\":" + std::to_string(ranks) + ",\"to\":" + std::to_string(ranks - 1) + ",\"excluded_rank\":" + std::to_string(blamed) +
                   ",\"slot\":" + std::to_string(slots[static_cast<size_t>(blamed)]));
  slots.erase(slots.begin() + blamed);
  previously_blamed = -1;
}

// A failure and where the run had got to. A hang's cause names every rank's step already, so a
// second step number would only confuse it.
std::string failure_at(const std::string& cause, int64_t step_reached) {
  return cause.rfind("hang", 0) == 0 ? cause : cause + " at step " + std::to_string(step_reached);
}

// The last line of a run that stops without finishing (a failure with no restart left, or
// Ctrl-C): what happened, the newest checkpoint, and the command that continues the run. An
// error the ranks reported themselves (bad input, an internal error) is on the terminal once
// already, and a run without restarts has nothing to add to it.
void say_why_stopped(const SupervisorOptions& options, int n, const AttemptResult& result, const std::string& cause, int64_t step_reached,
                     int64_t checkpoint, size_t ranks, int64_t nodes) {
  if (result.status == 2 && !result.interrupted) return;
  if (result.cause_shown && options.max_restarts == 0 && !result.interrupted) return;
  const std::string newest = checkpoint > 0 ? "newest checkpoint: step " + std::to_string(checkpoint) : "no checkpoint yet";
  const std::string resume = "`strata run -n " + std::to_string(ranks) + (nodes > 0 ? " --simulate-nodes " + std::to_string(nodes) : "") + " " + (options.run_dir / "strategy.toml").string() + " --out " +
                             options.run_dir.string() + " --resume`";
  if (result.interrupted)
    std::cerr << "strata: interrupted at step " << step_reached << " (" << newest << "); continue with " << resume << "\n";
  else if (options.max_restarts > 0)
    std::cerr << "strata: error: giving up after " << n << " restart" << (n == 1 ? "" : "s") << " ([job] max_restarts = "
              << options.max_restarts << "); last failure: " << failure_at(cause, step_reached) << " (" << newest
              << "); continue with " << resume << "\n";
  else
    std::cerr << "strata: error: " << failure_at(cause, step_reached) << "; no restart ([job] max_restarts = 0) (" << newest
              << "); continue with " << resume << ", or set [job] max_restarts to restart automatically\n";
}

}  // namespace

int supervise(const SupervisorOptions& options,
              const std::function<AttemptResult(bool resume, int attempt, const std::vector<int>& slots)>& attempt) {
  const auto started = Clock::now();
  EventLog events(options.run_dir / "events.jsonl");
  int64_t restarts = 0, recomputed_steps = 0;
  std::vector<int> slots(static_cast<size_t>(options.ranks));  // the device slots in use, one per rank
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int>(i);
  int previously_blamed = -1, previously_lost = -1;
  int64_t nodes = options.simulated_nodes;
  double recovery_seconds = 0;
  Clock::time_point failed_at = started;  // when the last failed attempt ended
  // The step the last restart was counted from. With the breakpoint persisted while the next
  // attempt starts, that is the newest snapshot, assumed whole; if the ranks find it damaged they
  // resume from an older one, and the steps in between are recomputed too.
  int64_t counted_from = -1;
  TimeAccount account;
  // Flash checkpoints: a fresh run starts without snapshots; a resumed one first writes to disk
  // what a supervisor killed before it could left in memory.
  std::optional<FlashPersister> flash;
  if (!options.flash_dir.empty()) start_flash_persister(flash, options, events);
  for (int n = 0;; ++n) {
    if (options.health_check != "off") {
      const auto checking = Clock::now();
      const bool may_start = check_before_start(options, n, events, slots);
      account.health_check_s += seconds_since(checking);
      if (!may_start) return 1;
    }
    const int64_t ranks = static_cast<int64_t>(slots.size());
    events.write("start", n, (n == 0 ? std::string() : std::string(",\"resume\":true")) + ",\"ranks\":" + std::to_string(ranks));
    if (flash) flash->start();
    const auto attempt_started = Clock::now();
    const AttemptResult result = attempt(n > 0, n, slots);
    // Persist at breakpoint: the newest snapshot goes to disk before anything else, failure or not.
    const auto attempt_ended = Clock::now();
    if (counted_from >= 0 && result.first_step_s >= 0 && result.resumed_step < counted_from)
      recomputed_steps += counted_from - result.resumed_step;
    counted_from = -1;
    if (n > 0) record_recovery(events, n, result, failed_at, attempt_started, options.run_dir);
    bool persisted = true;
    // A failure the run restarts from (the conditions below) persists while the next attempt
    // starts: its ranks wait for it only before restoring. A run that stops waits for it here.
    const bool restarts_next = result.status != 0 && result.status != 2 && !result.interrupted && n < options.max_restarts;
    if (flash) {
      flash->stop();
      if (restarts_next)
        flash->persist_newest_in_background("failure");
      else if (result.status != 0 || options.persist_at_end)
        persisted = flash->persist_newest(result.status == 0 ? "end" : "failure");
    }
    account.checkpoint_s += result.checkpoint_s - result.replica_s;
    account.replica_s += result.replica_s;
    const bool from_peers = result.restored_from == static_cast<int>(RestoreSource::PeerMemory);
    if (n > 0) (from_peers ? account.peer_reload_s : account.reload_s) += result.restore_s;
    account.hang_s += result.hang_s;
    if (result.status == 0) {
      const MetricsSummary kept = read_metrics(options.run_dir);
      const double wall = seconds_since(started), goodput = wall > 0 ? kept.kept_ms / 1000.0 / wall : 0.0;
      std::ostringstream fields;
      fields.precision(6);
      fields << ",\"step\":" << kept.last_step << ",\"restarts\":" << restarts << ",\"recomputed_steps\":" << recomputed_steps
             << ",\"wall_s\":" << wall << account.fields(wall, kept.kept_ms / 1000.0) << ",\"recovery_s\":" << recovery_seconds
             << ",\"goodput\":" << goodput;
      if (flash) {
        // What the snapshots cost each node's memory: its ranks' two slots each, plus the
        // replicas it holds for other nodes.
        std::ostringstream line;
        line.precision(1);
        line << std::fixed << "strata: flash snapshots held in shared memory, at most:";
        fields << ",\"snapshot_store_peak_bytes\":{";
        bool first = true;
        for (const auto& [store, bytes] : flash->peak_store_bytes()) {
          fields << (first ? "" : ",") << "\"" << store << "\":" << bytes;
          line << (first ? " " : ", ") << store << " " << static_cast<double>(bytes) / (1 << 20) << " MiB";
          first = false;
        }
        fields << "}";
        if (!first) std::cerr << line.str() << "\n";
      }
      events.write("finish", n, fields.str());
      if (!persisted) {
        std::cerr << "strata: error: the final flash snapshot could not be written to disk (see events.jsonl); it stays in "
                  << options.flash_dir.string() << " and `strata run --resume` writes it\n";
        return 1;
      }
      if (flash) flash->remove();
      if (restarts > 0) {
        std::ostringstream line;
        line.precision(3);
        line << "strata: finished after " << restarts << " restart" << (restarts > 1 ? "s" : "") << "; goodput " << goodput << " (kept steps "
             << kept.kept_ms / 1000.0 << " s of " << wall << " s wall; " << recomputed_steps << " steps recomputed, " << recovery_seconds << " s restarting)";
        std::cerr << line.str() << "\n";
      }
      return 0;
    }
    const MetricsSummary reached = read_metrics(options.run_dir);
    const int64_t step_reached = std::max(reached.last_step, result.step_finished);
    const int64_t checkpoint = flash && restarts_next ? flash->breakpoint_step() : newest_checkpoint_step(options.run_dir);
    const std::string cause = result.interrupted ? "interrupted (Ctrl-C or SIGTERM)"
                              : !result.cause.empty() ? result.cause
                                                      : "ranks exited with status " + std::to_string(result.status);
    record_failure(events, n, result, cause, step_reached, checkpoint, options.run_dir);
    // Bad input fails the same way again; Ctrl-C means stop. Both leave a resumable run.
    if (result.status == 2 || result.interrupted || n >= options.max_restarts) {
      say_why_stopped(options, n, result, cause, step_reached, checkpoint, slots.size(), nodes);
      if (flash && persisted) flash->remove();  // everything is on disk
      // 2 (bad input) stays 2; a stop by Ctrl-C or SIGTERM is 130, as in one process; any other
      // failure (mpirun's 128 + signal included) is 1.
      return result.status == 2 ? 2 : result.interrupted ? 130 : 1;
    }
    const int blamed = blamed_rank(cause);
    if (shrink_if_node_lost_twice(lost_node(blamed, options, nodes, slots.size()), previously_lost, options, nodes, slots, events, n,
                                  flash ? &*flash : nullptr))
      previously_blamed = -1;
    else
      shrink_if_blamed_twice(blamed, previously_blamed, options, slots, events, n);
    const double backoff = std::min(60.0, options.backoff_seconds * std::pow(2.0, static_cast<double>(n)));
    std::cerr << "strata: " << failure_at(cause, step_reached) << "; restarting all ranks from "
              << (checkpoint > 0 ? "the checkpoint of step " + std::to_string(checkpoint) : std::string("step 0")) << " in "
              << backoff << " s (restart " << n + 1 << " of " << options.max_restarts << ")\n";
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    ++restarts;
    recomputed_steps += std::max<int64_t>(0, step_reached - checkpoint);
    counted_from = checkpoint;
    account.recomputed_s += reached.ms_after(checkpoint, step_reached) / 1000.0;
    account.restart_s += seconds_since(attempt_ended);
    recovery_seconds += seconds_since(attempt_ended);
    failed_at = attempt_ended;
  }
}

}  // namespace strata::cli
