// The inline SVG charts of `strata report`: drawn here, so the report needs no script and no
// network to open.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace strata::cli {

extern const char* const kColors[8];

struct Series {
  std::string label;
  const char* color;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
  bool dots = false;  // a scatter: a dot per point, no line
};

// Text made safe inside HTML.
std::string escape(const std::string& text);
std::string number(double v, int precision = 4);

// One chart: lines (or dots) over a shared x axis named `x_label`.
std::string chart(const std::string& title, const std::string& unit, const std::vector<Series>& series,
                  const std::string& x_label = "step");

}  // namespace strata::cli
