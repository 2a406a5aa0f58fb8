// Wall-clock timing for the benches: one call's milliseconds on the host clock, and the median of
// a bench's interleaved rounds (cuda_timing.h times GPU calls with events and uses the same median).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace strata::bench {

inline double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

inline double ms_of(const std::function<void()>& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace strata::bench
