// Learning rate as a function of the optimizer step: linear warmup, then
//   cosine / linear: from lr down to min_lr_ratio * lr at the last step;
//   constant: lr;
//   wsd (warmup-stable-decay): lr until the last decay_fraction of the steps, then down to
//     min_lr_ratio * lr at the last step in decay_shape: "linear" (1 - p), "sqrt" (1 - sqrt(p),
//     the cooldown Hägele et al. 2024 found best) or "cosine" (half a cosine), p the fraction of
//     the decay done. The stable phase's checkpoints can train on at the peak rate: a resume with
//     more steps moves the decay to the new end.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace strata::engine {

struct LrSchedule {
  double lr;
  std::string kind;  // "cosine", "linear", "constant", "wsd"
  int64_t warmup_steps;
  int64_t total_steps;
  double min_lr_ratio;
  double decay_fraction = 0.2;        // wsd
  std::string decay_shape = "linear";  // wsd: "linear", "sqrt", "cosine"

  // The first step of wsd's decay (the steps after it decay; never inside the warmup).
  int64_t decay_start() const {
    const auto decay_steps = static_cast<int64_t>(std::llround(decay_fraction * static_cast<double>(total_steps)));
    return std::max(warmup_steps, total_steps - decay_steps);
  }

  // step counts from 1.
  double at(int64_t step) const {
    if (step <= warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
    if (kind == "constant" || total_steps <= warmup_steps) return lr;
    const int64_t start = kind == "wsd" ? decay_start() : warmup_steps;
    if (step <= start) return lr;  // wsd's stable phase
    const double progress = static_cast<double>(step - start) / static_cast<double>(total_steps - start);
    const double min_lr = lr * min_lr_ratio;
    const std::string& shape = kind == "wsd" ? decay_shape : kind;
    if (shape == "linear") return lr - (lr - min_lr) * progress;
    if (shape == "sqrt") return min_lr + (lr - min_lr) * (1.0 - std::sqrt(progress));
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  }
};

}  // namespace strata::engine
