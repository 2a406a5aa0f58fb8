#include "op_profile.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include <ATen/record_function.h>

#include "strata/errors.h"

namespace strata::engine {

namespace {

using Clock = std::chrono::steady_clock;

struct Totals {
  int64_t calls = 0;
  double self_ms = 0, total_ms = 0;
};

// One profile at a time: RecordFunction callbacks are plain functions.
std::mutex totals_mutex;
std::map<std::string, Totals> totals;

// The operators running on this thread, innermost last, with the time their callees took.
struct Frame {
  Clock::time_point start;
  double children_ms = 0;
};
thread_local std::vector<Frame> frames;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction&) {
  frames.push_back({Clock::now(), 0});
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  if (frames.empty()) return;  // entered before the profile started
  const Frame frame = frames.back();
  frames.pop_back();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - frame.start).count();
  if (!frames.empty()) frames.back().children_ms += ms;
  std::lock_guard<std::mutex> lock(totals_mutex);
  Totals& t = totals[fn.name()];
  ++t.calls;
  t.total_ms += ms;
  t.self_ms += ms - frame.children_ms;
}

}  // namespace

OpProfile::~OpProfile() { stop(); }

void OpProfile::start() {
  if (running_) return;
  {
    std::lock_guard<std::mutex> lock(totals_mutex);
    totals.clear();
  }
  frames.clear();
  // ATen operators and autograd nodes; inputs are not needed, which keeps the overhead small.
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                      .needsInputs(false)
                                      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  running_ = true;
}

void OpProfile::stop() {
  if (!running_) return;
  at::removeCallback(handle_);
  running_ = false;
}

void OpProfile::add_step(double step_ms) {
  ++steps_;
  step_ms_ += step_ms;
}

void OpProfile::write(const std::filesystem::path& file, const std::string& title) const {
  std::vector<std::pair<std::string, Totals>> rows;
  {
    std::lock_guard<std::mutex> lock(totals_mutex);
    rows.assign(totals.begin(), totals.end());
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.self_ms > b.second.self_ms; });
  std::ofstream out(file);
  if (!out) throw UserError("cannot write the profile " + file.string());
  const double per_step = steps_ > 0 ? step_ms_ / steps_ : 0;
  double recorded = 0;
  for (const auto& [name, t] : rows) recorded += t.self_ms;
  char line[512];
  out << "# " << title << "\n\n";
  std::snprintf(line, sizeof line,
                "%lld profiled steps, %.2f ms per step (wall); operators account for %.2f ms per step (%.1f%%), the rest is "
                "Strata's own code and waiting.\n\n",
                static_cast<long long>(steps_), per_step, steps_ > 0 ? recorded / steps_ : 0.0,
                step_ms_ > 0 ? 100.0 * recorded / step_ms_ : 0.0);
  out << line;
  out << "| operator | calls/step | self ms/step | share of step | total ms/step |\n|---|---|---|---|---|\n";
  const double steps = static_cast<double>(std::max<int64_t>(1, steps_));
  for (const auto& [name, t] : rows) {
    std::snprintf(line, sizeof line, "| %s | %.1f | %.3f | %.1f%% | %.3f |\n", name.c_str(), t.calls / steps, t.self_ms / steps,
                  step_ms_ > 0 ? 100.0 * t.self_ms / step_ms_ : 0.0, t.total_ms / steps);
    out << line;
  }
}

}  // namespace strata::engine
