#include "svg_chart.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace strata::cli {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string number(double v, int precision) {
  std::ostringstream out;
  out.precision(precision);
  out << v;
  return out.str();
}

const char* const kColors[8] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

namespace {

// An axis label: 80k rather than 8e+04.
std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return number(v / 1e9, 3) + "G";
  if (a >= 1e6) return number(v / 1e6, 3) + "M";
  if (a >= 1e4) return number(v / 1e3, 3) + "k";
  return number(v);
}

// Tick values at a round spacing (1, 2 or 5 x 10^k), about `count` of them over [low, high].
std::vector<double> ticks(double low, double high, int count = 5) {
  const double raw = (high - low) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = magnitude * (raw / magnitude < 1.5 ? 1 : raw / magnitude < 3.5 ? 2 : raw / magnitude < 7.5 ? 5 : 10);
  std::vector<double> out;
  for (double t = std::ceil(low / step) * step; t <= high + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

}  // namespace

std::string chart(const std::string& title, const std::string& unit, const std::vector<Series>& series, const std::string& x_label) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!std::isfinite(x0)) return "";
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= std::max(1e-12, std::abs(y0) * 0.05), y1 += std::max(1e-12, std::abs(y1) * 0.05);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  constexpr double W = 560, H = 300, L = 70, R = 16, T = 44, B = 40;
  auto sx = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto sy = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::ostringstream svg;
  svg << "<figure><svg class=\"chart\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\"" << escape(title) << "\">";
  svg << "<text x=\"" << L << "\" y=\"18\" class=\"title\">" << escape(title) << (unit.empty() ? "" : " (" + escape(unit) + ")") << "</text>";
  double legend_x = L;
  for (const auto& s : series) {  // legend
    svg << "<rect x=\"" << legend_x << "\" y=\"26\" width=\"10\" height=\"10\" fill=\"" << s.color << "\"/><text x=\"" << legend_x + 14
        << "\" y=\"35\" class=\"legend\">" << escape(s.label) << "</text>";
    legend_x += 24 + 6.5 * static_cast<double>(s.label.size());
  }
  for (double t : ticks(y0, y1))
    svg << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << sy(t) << "\" y2=\"" << sy(t) << "\" class=\"grid\"/><text x=\"" << L - 6
        << "\" y=\"" << sy(t) + 4 << "\" class=\"ytick\">" << tick_label(t) << "</text>";
  for (double t : ticks(x0, x1, 6))
    svg << "<text x=\"" << sx(t) << "\" y=\"" << H - B + 16 << "\" class=\"xtick\">" << number(t, 6) << "</text>";
  svg << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" class=\"xtick\">" << escape(x_label) << "</text>";
  svg << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B << "\" class=\"frame\"/>";
  for (const auto& s : series) {
    if (s.dots) {
      for (const auto& [x, y] : s.points)
        svg << "<circle cx=\"" << number(sx(x), 6) << "\" cy=\"" << number(sy(y), 6) << "\" r=\"3\" fill=\"" << s.color << "\"><title>"
            << escape(s.label) << ": " << number(x) << ", " << number(y) << "</title></circle>";
      continue;
    }
    svg << "<polyline data-run=\"" << escape(s.label) << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.6\""
        << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << " points=\"";
    for (const auto& [x, y] : s.points) svg << number(sx(x), 6) << "," << number(sy(y), 6) << " ";
    svg << "\"><title>" << escape(s.label) << "</title></polyline>";
    if (s.points.size() == 1)
      svg << "<circle cx=\"" << sx(s.points[0].first) << "\" cy=\"" << sy(s.points[0].second) << "\" r=\"3\" fill=\"" << s.color << "\"/>";
  }
  svg << "</svg></figure>\n";
  return svg.str();
}


}  // namespace strata::cli
