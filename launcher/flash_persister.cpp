#include "flash_persister.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "strata/core/flash_checkpoint.h"
#include "strata/errors.h"

namespace strata::cli {

namespace fs = std::filesystem;

int64_t newest_checkpoint_step(const fs::path& run_dir) {
  int64_t newest = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir / "checkpoints", ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) newest = std::max<int64_t>(newest, std::atoll(name.c_str() + 5));
  }
  return newest;
}

FlashPersister::FlashPersister(fs::path flash_dir, fs::path checkpoints_dir, int64_t every, int64_t keep,
                               std::function<void(const std::string&, const std::string&)> log, double pause_seconds)
    : flash_dir_(std::move(flash_dir)),
      checkpoints_dir_(std::move(checkpoints_dir)),
      every_(every),
      keep_(keep),
      log_(std::move(log)),
      pause_seconds_(pause_seconds) {
  persisted_ = newest_checkpoint_step(checkpoints_dir_.parent_path());
  std::error_code ignored;
  fs::remove(breakpoint_persist_marker(flash_dir_), ignored);  // a killed supervisor's
}

FlashPersister::~FlashPersister() {
  stop();
  wait_for_breakpoint();
}

void FlashPersister::start() {
  stop();
  stop_ = false;
  thread_ = std::thread([this] {
    {  // a new attempt writes new snapshots, possibly of the same steps (once a breakpoint persist is done)
      const std::lock_guard<std::mutex> after_the_breakpoint(persisting_);
      failed_.clear();
    }
    for (int64_t tick = 1; !stop_; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // two header reads per rank
      if (every_ > 0) persist_one("background", [this](int64_t step) { return step % every_ == 0; });
      if (tick % 100 == 0) measure_stores();
    }
  });
}

void FlashPersister::stop() {
  stop_ = true;
  if (thread_.joinable()) {
    thread_.join();
    measure_stores();
  }
}

void FlashPersister::measure_stores() {
  std::map<std::string, uint64_t> now;
  std::error_code ec;
  for (const auto& store : fs::directory_iterator(flash_dir_, ec)) {
    const std::string name = store.path().filename().string();
    if (name.rfind("node_", 0) != 0 || !store.is_directory(ec)) continue;
    uint64_t& bytes = now[name];
    for (const auto& file : fs::directory_iterator(store.path(), ec))
      if (file.is_regular_file(ec)) bytes += file.file_size(ec);
  }
  const std::lock_guard<std::mutex> lock(measuring_);
  for (const auto& [name, bytes] : now) peak_store_bytes_[name] = std::max(peak_store_bytes_[name], bytes);
}

std::map<std::string, uint64_t> FlashPersister::peak_store_bytes() const {
  const std::lock_guard<std::mutex> lock(measuring_);
  return peak_store_bytes_;
}

bool FlashPersister::persist_newest(const std::string& when) {
  return persist_one(when, [](int64_t) { return true; });
}

void FlashPersister::persist_newest_in_background(const std::string& when) {
  wait_for_breakpoint();
  const std::vector<FlashSet> sets = complete_flash_sets(flash_dir_);
  breakpoint_step_ = std::max<int64_t>(persisted_, sets.empty() ? 0 : sets.front().info.step);
  const fs::path marker = breakpoint_persist_marker(flash_dir_);
  std::ofstream(marker).put('\n');
  breakpoint_ = std::thread([this, when, marker] {
    persist_newest(when);
    std::error_code ignored;
    fs::remove(marker, ignored);
  });
}

void FlashPersister::wait_for_breakpoint() {
  if (breakpoint_.joinable()) breakpoint_.join();
}

bool FlashPersister::persist_one(const std::string& when, const std::function<bool(int64_t)>& eligible) {
  const std::lock_guard<std::mutex> one_at_a_time(persisting_);
  bool any_failed = false;
  for (const FlashSet& set : complete_flash_sets(flash_dir_)) {
    if (set.info.step <= persisted_) break;  // newest first: the rest are older still
    if (!eligible(set.info.step)) continue;
    if (failed_.count(set.info.step)) {  // already reported; an older set may still do
      any_failed = any_failed || when != "background";
      continue;
    }
    const auto started = std::chrono::steady_clock::now();
    std::ostringstream fields;
    fields.precision(6);
    try {
      const uint64_t bytes = persist_flash_set(set, checkpoints_dir_, keep_, pause_seconds_);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      persisted_ = set.info.step;
      seconds_ = seconds_ + seconds;
      fields << ",\"step\":" << set.info.step << ",\"when\":\"" << when << "\",\"bytes\":" << bytes << ",\"seconds\":" << seconds;
      log_("persist", fields.str());
      return true;
    } catch (const FlashSetChanged&) {
      // A rank took the set back before it was held: routine while ranks run; a newer set follows.
      if (when == "background") return true;
      continue;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      std::string quoted;
      for (char c : what) quoted += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
      fields << ",\"step\":" << set.info.step << ",\"when\":\"" << when << "\",\"cause\":\"" << quoted << "\"";
      log_("persist_failed", fields.str());
      any_failed = true;
      failed_.insert(set.info.step);
      if (when == "background") return false;
    }
  }
  return !any_failed;
}

void FlashPersister::remove() {
  stop();
  wait_for_breakpoint();
  std::error_code ignored;
  fs::remove_all(flash_dir_, ignored);
}

}  // namespace strata::cli
