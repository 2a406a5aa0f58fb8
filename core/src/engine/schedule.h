// Learning rate as a function of the optimizer step: linear warmup, then cosine, linear or
// constant decay to min_lr_ratio * lr at the last step.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace strata::engine {

struct LrSchedule {
  double lr;
  std::string kind;  // "cosine", "linear", "constant"
  int64_t warmup_steps;
  int64_t total_steps;
  double min_lr_ratio;

  // step counts from 1.
  double at(int64_t step) const {
    if (step <= warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
    if (kind == "constant" || total_steps <= warmup_steps) return lr;
    const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    const double min_lr = lr * min_lr_ratio;
    if (kind == "linear") return lr - (lr - min_lr) * progress;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  }
};

}  // namespace strata::engine
