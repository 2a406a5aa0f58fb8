// Per-step metrics: metrics.jsonl in the run directory (one object per optimizer step, losses
// with 17 significant digits so runs compare exactly) and the console line and progress bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/core/trainer.h"
#include "strata/step_program.h"

namespace strata::engine {

using StepRecord = strata::StepRecord;  // strata/core/trainer.h

class MetricsFile {
 public:
  // Keeps the records of steps up to `keep_through` (those before a resume) and appends after.
  MetricsFile(const std::filesystem::path& path, int64_t keep_through);
  // Appends one record; a failed write (a full disk) is a UserError.
  void write(const StepRecord& record);

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

class Console {
 public:
  // Lines always go to the log files; to standard output only when `to_stdout` (rank 0).
  Console(int64_t total_steps, int64_t log_every, double flops_per_token, double peak_tflops, bool to_stdout);
  void step(const StepRecord& record);
  void message(const std::string& line);
  void finish();

 private:
  void draw_bar();
  void clear_bar();

  int64_t total_, log_every_;
  double flops_per_token_, peak_flops_;
  bool stdout_, tty_;
  bool bar_shown_ = false;
  int64_t step_ = 0, first_step_ = -1;
  std::chrono::steady_clock::time_point start_;
  double window_ms_ = 0;
  int64_t window_tokens_ = 0, window_steps_ = 0;
};

std::string format_number(double value);  // %.17g: exact round trip

// A step's figures with one entry per name, in the order names first appear: values a stage
// reported more than once in the step (WSAM runs the gradients stage twice, so ddp's exposed
// communication comes twice) are summed, as a model's per-module figures are.
std::vector<std::pair<std::string, double>> summed_by_name(const std::vector<std::pair<std::string, double>>& figures);

// Figures come to the host through strata::read_on_host (strata/step_program.h), which counts
// its calls: the step loop reads only on steps that log, evaluate or checkpoint
// (Trainer::Impl::advance).
using strata::host_read_count;
using strata::read_on_host;

}  // namespace strata::engine
