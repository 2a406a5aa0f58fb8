// Small figures over measured samples, one definition for core and the launcher.
#pragma once

#include <algorithm>
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

}  // namespace strata
