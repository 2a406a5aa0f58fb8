// Small figures over measurements, one definition for core and the launcher.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace strata {

// The middle value (the mean of the two middle ones for an even count); NaN for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Seconds of the steady clock since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace strata
