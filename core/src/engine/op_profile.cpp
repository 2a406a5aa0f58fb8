#include "op_profile.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

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
std::map<std::string, Totals> kernel_totals;  // device kernels by name: calls and time (self = total)

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

void OpProfile::start(bool device_kernels) {
  if (running_) return;
  {
    std::lock_guard<std::mutex> lock(totals_mutex);
    totals.clear();
    kernel_totals.clear();
  }
  if (device_kernels) {
    namespace profiler = torch::profiler::impl;
    const profiler::ProfilerConfig config(profiler::ProfilerState::KINETO);
    const std::set<profiler::ActivityType> activities{profiler::ActivityType::CPU, profiler::ActivityType::CUDA};
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    kernels_running_ = true;
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
  if (!kernels_running_) return;
  kernels_running_ = false;
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  std::lock_guard<std::mutex> lock(totals_mutex);
  for (const auto& event : result->events()) {
    if (event.deviceType() == c10::DeviceType::CPU) continue;
    Totals& t = kernel_totals[event.name()];
    ++t.calls;
    t.total_ms += static_cast<double>(event.durationNs()) / 1e6;
    t.self_ms = t.total_ms;
  }
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
  std::vector<std::pair<std::string, Totals>> kernels;
  {
    std::lock_guard<std::mutex> lock(totals_mutex);
    kernels.assign(kernel_totals.begin(), kernel_totals.end());
  }
  if (kernels.empty()) return;
  std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.second.total_ms > b.second.total_ms; });
  double busy = 0, launches = 0;
  for (const auto& [name, t] : kernels) busy += t.total_ms, launches += static_cast<double>(t.calls);
  std::snprintf(line, sizeof line,
                "\n## Device kernels\n\n%.0f kernels (and copies) per step, %.2f ms per step of device time: the device was busy "
                "%.1f%% of the step's wall time.\n\n",
                launches / steps, busy / steps, step_ms_ > 0 ? 100.0 * busy / step_ms_ : 0.0);
  out << line << "| kernel | calls/step | ms/step | share of device time |\n|---|---|---|---|\n";
  for (size_t i = 0; i < std::min<size_t>(kernels.size(), 40); ++i) {
    const auto& [name, t] = kernels[i];
    std::string shown = name.size() > 120 ? name.substr(0, 117) + "..." : name;
    std::replace(shown.begin(), shown.end(), '|', '/');  // a table cell
    std::snprintf(line, sizeof line, "| `%s` | %.1f | %.3f | %.1f%% |\n", shown.c_str(), t.calls / steps, t.total_ms / steps,
                  busy > 0 ? 100.0 * t.total_ms / busy : 0.0);
    out << line;
  }
}

}  // namespace strata::engine
