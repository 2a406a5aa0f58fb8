#include "metrics.h"

#include <algorithm>
#include <atomic>

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <iostream>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>

#include "strata/core/launch_env.h"
#include "strata/core/process_memory.h"
#include "strata/core/log.h"
#include "strata/errors.h"

namespace strata::engine {

std::vector<std::pair<std::string, double>> summed_by_name(const std::vector<std::pair<std::string, double>>& figures) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, value] : figures) {
    const auto same = std::find_if(out.begin(), out.end(), [&](const auto& entry) { return entry.first == name; });
    if (same == out.end())
      out.emplace_back(name, value);
    else
      same->second += value;
  }
  return out;
}

std::string format_number(double value) {
  if (!std::isfinite(value)) return "null";  // JSON has no inf or nan (e.g. the norm of a skipped step)
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

namespace {

// The step of a complete record line ({"step":N,...}), or -1 for anything else (a line cut short
// by a full disk or a kill, text that is not a record).
int64_t step_of(const std::string& line) {
  constexpr std::string_view prefix = "{\"step\":";
  if (line.rfind(prefix, 0) != 0 || line.back() != '}') return -1;
  int64_t step = 0;
  size_t i = prefix.size();
  const size_t digits_begin = i;
  for (; i < line.size() && line[i] >= '0' && line[i] <= '9' && i - digits_begin < 18; ++i) step = step * 10 + (line[i] - '0');
  if (i == digits_begin || i >= line.size() || line[i] != ',') return -1;
  return step;
}

// Timings vary run to run; three decimals are plenty.
std::string fixed3(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", value);
  return buf;
}

std::string human_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(s / 3600), static_cast<long>(s % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(s / 60), static_cast<long>(s % 60));
  return buf;
}

}  // namespace

MetricsFile::MetricsFile(const std::filesystem::path& path, int64_t keep_through) : path_(path) {
  // Keep the leading complete records of steps in increasing order up to keep_through and cut
  // the file after them, in place: what the run saved before stays even if this process dies
  // here. A step may be missing (a rank died after its snapshot was taken and before its line
  // was written): the lines after it, from the attempt that resumed there, stay.
  std::uintmax_t keep_bytes = 0;
  if (keep_through > 0) {
    std::ifstream in(path, std::ios::binary);
    int64_t previous = 0;
    for (std::string line; std::getline(in, line) && !in.eof();) {
      const int64_t step = step_of(line);
      if (step <= previous || step > keep_through) break;
      keep_bytes += line.size() + 1;
      previous = step;
    }
  }
  std::error_code ec;
  if (keep_bytes > 0) std::filesystem::resize_file(path, keep_bytes, ec);
  if (ec) throw UserError("cannot truncate " + path.string() + " to the steps before the resume: " + ec.message());
  out_.open(path, keep_bytes > 0 ? std::ios::app : std::ios::trunc);
  if (!out_) throw UserError("cannot write " + path.string() + ": " + std::strerror(errno));
}

void MetricsFile::write(const StepRecord& r) {
  out_ << "{\"step\":" << r.step << ",\"loss\":" << format_number(r.loss) << ",\"grad_norm\":" << format_number(r.grad_norm)
       << ",\"lr\":" << format_number(r.lr) << ",\"tokens\":" << r.tokens << ",\"step_ms\":" << fixed3(r.step_ms);
  if (r.val_loss) out_ << ",\"val_loss\":" << format_number(*r.val_loss);
  for (const auto& [name, value] : r.extra) out_ << ",\"" << name << "\":" << fixed3(value);
  out_ << "}\n";
  // A failed write (a full disk) stops the run here, not silently at the next checkpoint.
  if (!out_.flush())
    throw UserError("cannot write " + path_.string() + " at step " + std::to_string(r.step) + ": " + std::strerror(errno) +
                    "; the checkpoints saved so far are intact (resume with --resume once there is room)");
}

Console::Console(int64_t total_steps, int64_t log_every, double flops_per_token, double peak_tflops, bool to_stdout)
    : total_(total_steps),
      log_every_(log_every),
      flops_per_token_(flops_per_token),
      peak_flops_(peak_tflops * 1e12),
      stdout_(to_stdout),
      tty_(to_stdout && stdout_is_terminal()),
      start_(std::chrono::steady_clock::now()) {}

void Console::clear_bar() {
  if (bar_shown_) std::cout << "\r\033[K";
  bar_shown_ = false;
}

void Console::draw_bar() {
  if (!tty_) return;
  const int width = 30;
  const double done = static_cast<double>(step_) / static_cast<double>(total_);
  const int filled = static_cast<int>(done * width);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t steps_run = step_ - first_step_ + 1;
  const double eta = steps_run > 0 ? elapsed / static_cast<double>(steps_run) * static_cast<double>(total_ - step_) : 0;
  std::cout << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << step_ << "/"
            << total_ << "  elapsed " << human_duration(elapsed) << "  ETA " << human_duration(eta) << std::flush;
  bar_shown_ = true;
}

void Console::step(const StepRecord& r) {
  if (first_step_ < 0) first_step_ = r.step;
  step_ = r.step;
  window_ms_ += r.step_ms;
  window_tokens_ += r.tokens;
  ++window_steps_;
  if (r.step % log_every_ == 0 || r.step == total_ || r.val_loss) {
    const double tokens_per_s = window_ms_ > 0 ? static_cast<double>(window_tokens_) / (window_ms_ / 1000.0) : 0;
    char line[256];
    std::snprintf(line, sizeof line, "step %ld/%ld | loss %.4f | grad_norm %.3f | lr %.3e | %.0f tok/s | %.1f ms/step",
                  static_cast<long>(r.step), static_cast<long>(total_), r.loss, r.grad_norm, r.lr, tokens_per_s,
                  window_ms_ / static_cast<double>(window_steps_));
    std::string text = line;
    if (peak_flops_ > 0) {
      char mfu[32];
      std::snprintf(mfu, sizeof mfu, " | mfu %.2f%%", 100.0 * flops_per_token_ * tokens_per_s / peak_flops_);
      text += mfu;
    }
    char memory[32];
    std::snprintf(memory, sizeof memory, " | mem %.0f MiB", resident_bytes() / (1024.0 * 1024.0));
    text += memory;
    if (r.val_loss) {
      char val[32];
      std::snprintf(val, sizeof val, " | val_loss %.4f", *r.val_loss);
      text += val;
    }
    message(text);
    window_ms_ = 0;
    window_tokens_ = window_steps_ = 0;
  }
  draw_bar();
}

void Console::message(const std::string& line) {
  log::record(line);
  if (!stdout_) return;
  clear_bar();
  std::cout << line << "\n" << std::flush;
  draw_bar();
}

void Console::finish() {
  clear_bar();
  std::cout << std::flush;
}

}  // namespace strata::engine

// The plugin API's counted read (strata/step_program.h).
namespace strata {

namespace {
std::atomic<int64_t> host_reads{0};
}

int64_t host_read_count() { return host_reads.load(); }

std::vector<double> read_on_host(const std::vector<at::Tensor>& values) {
  host_reads.fetch_add(1);
  std::vector<at::Tensor> parts;
  c10::Device device = at::kCPU;
  for (const auto& v : values) {
    parts.push_back(v.defined() ? v.detach().to(at::kDouble).reshape(-1) : at::zeros({1}, at::kDouble));
    if (!parts.back().is_cpu()) device = parts.back().device();
  }
  for (auto& p : parts) p = p.to(device);  // a host value among device ones (a pipeline's loss) joins them
  const at::Tensor all = at::cat(parts).cpu();
  const double* data = all.const_data_ptr<double>();
  return {data, data + all.numel()};
}

}  // namespace strata
