// strata report: one self-contained HTML file showing runs: a summary table, and curves of
// loss, validation loss, learning rate, tokens/s, step time, peak memory and checkpoint blocking,
// the runs overlaid to compare strategies, plus each run's goodput breakdown and strategy. The
// charts are inline SVG drawn here: the file needs no script and no network to open.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Run {
  std::string name;
  fs::path dir;
  std::map<int64_t, json> steps;  // metrics.jsonl, the last record of each step
  std::optional<json> finish;     // events.jsonl's last finish event (supervised runs)
  int64_t restarts = 0;
  std::string strategy;           // strategy.toml as resolved
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Run load_run(const std::string& arg) {
  Run run;
  run.dir = fs::path(arg);
  const fs::path metrics = run.dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics)) throw UserError(arg + " has no metrics.jsonl: not a run directory (strata run --out DIR)");
  std::ifstream in(metrics);
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      throw UserError(metrics.string() + " line " + std::to_string(line_number) + " is not a metrics record");
    const int64_t step = record["step"].get<int64_t>();
    run.steps[step] = std::move(record);
  }
  if (run.steps.empty()) throw UserError(metrics.string() + " holds no steps");
  std::ifstream events(run.dir / "events.jsonl");
  for (std::string line; std::getline(events, line);) {
    json event = json::parse(line, nullptr, false);
    if (event.is_discarded() || !event.is_object()) continue;  // a line cut by a kill: the others still count
    if (event.value("event", "") == "finish") run.finish = event;
  }
  if (run.finish && (*run.finish)["restarts"].is_number_integer()) run.restarts = (*run.finish)["restarts"].get<int64_t>();
  if (fs::is_regular_file(run.dir / "strategy.toml")) run.strategy = read_text(run.dir / "strategy.toml");
  return run;
}

// A number field of a record, or NaN where it is missing or not a number (null: not measured).
double num(const json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : NAN;
}

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

std::string number(double v, int precision = 4) {
  std::ostringstream out;
  out.precision(precision);
  out << v;
  return out.str();
}

// An axis label: 80k rather than 8e+04.
std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return number(v / 1e9, 3) + "G";
  if (a >= 1e6) return number(v / 1e6, 3) + "M";
  if (a >= 1e4) return number(v / 1e3, 3) + "k";
  return number(v);
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

struct Series {
  std::string label;
  const char* color;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
};

// Tick values at a round spacing (1, 2 or 5 x 10^k), about `count` of them over [low, high].
std::vector<double> ticks(double low, double high, int count = 5) {
  const double raw = (high - low) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = magnitude * (raw / magnitude < 1.5 ? 1 : raw / magnitude < 3.5 ? 2 : raw / magnitude < 7.5 ? 5 : 10);
  std::vector<double> out;
  for (double t = std::ceil(low / step) * step; t <= high + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

// One line chart as inline SVG; x is the step.
std::string chart(const std::string& title, const std::string& unit, const std::vector<Series>& series) {
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
  svg << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" class=\"xtick\">step</text>";
  svg << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B << "\" class=\"frame\"/>";
  for (const auto& s : series) {
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

// The series of `field` (scaled) for every run that records it.
std::vector<Series> field_series(const std::vector<Run>& runs, const std::string& field, double scale = 1.0, const std::string& suffix = "",
                                 bool dashed = false) {
  std::vector<Series> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    Series s{runs[i].name + suffix, kColors[i % std::size(kColors)], dashed, {}};
    for (const auto& [step, record] : runs[i].steps)
      if (const double v = num(record, field.c_str()); std::isfinite(v)) s.points.emplace_back(static_cast<double>(step), v * scale);
    if (!s.points.empty()) out.push_back(std::move(s));
  }
  return out;
}

std::string summary_table(const std::vector<Run>& runs) {
  std::ostringstream html;
  html << "<table><tr><th>run</th><th>steps</th><th>final loss</th><th>final val loss</th><th>median step ms</th>"
          "<th>median tokens/s</th><th>peak memory MiB</th><th>restarts</th><th>goodput</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    std::vector<double> step_ms, tokens_per_s;
    double peak = 0, val = NAN;
    for (const auto& [step, r] : run.steps) {
      const double ms = num(r, "step_ms"), tokens = num(r, "tokens");
      if (std::isfinite(ms)) step_ms.push_back(ms);
      if (std::isfinite(ms) && ms > 0 && std::isfinite(tokens)) tokens_per_s.push_back(tokens / (ms / 1000.0));
      if (const double p = num(r, "mem_peak_bytes"); std::isfinite(p)) peak = std::max(peak, p);
      if (const double v = num(r, "val_loss"); std::isfinite(v)) val = v;
    }
    const json& last = run.steps.rbegin()->second;
    auto cell = [](double v, int precision = 4) { return std::isnan(v) ? std::string("-") : number(v, precision); };
    html << "<tr><td><span class=\"swatch\" style=\"background:" << kColors[i % std::size(kColors)] << "\"></span>" << escape(run.name)
         << "</td><td>" << run.steps.rbegin()->first << "</td><td>" << cell(num(last, "loss")) << "</td><td>" << cell(val)
         << "</td><td>" << cell(median(step_ms)) << "</td><td>" << cell(median(tokens_per_s), 5) << "</td><td>"
         << cell(peak > 0 ? peak / (1 << 20) : NAN, 5) << "</td><td>" << (run.finish ? std::to_string(run.restarts) : "-") << "</td><td>"
         << (run.finish ? cell(num(*run.finish, "goodput"), 3) : "-") << "</td></tr>\n";
  }
  html << "</table>\n";
  return html.str();
}

// Where each supervised run's wall time went (the finish event's breakdown), as stacked bars.
std::string goodput_chart(const std::vector<Run>& runs) {
  static const std::vector<std::pair<const char*, const char*>> parts{
      {"kept_step_s", "#2ca02c"}, {"checkpoint_blocking_s", "#1f77b4"}, {"reload_s", "#17becf"}, {"recomputed_s", "#ff7f0e"},
      {"hang_s", "#d62728"},      {"restart_s", "#9467bd"},            {"health_check_s", "#8c564b"}, {"other_s", "#c7c7c7"}};
  std::vector<const Run*> supervised;
  for (const auto& run : runs)
    if (run.finish && num(*run.finish, "wall_s") > 0) supervised.push_back(&run);
  if (supervised.empty()) return "<p>No run here was supervised (<code>strata run -n N</code>), so there is no goodput breakdown.</p>\n";
  constexpr double W = 560, L = 150, R = 16, bar = 22;
  const double H = 80 + bar * 1.6 * static_cast<double>(supervised.size());
  std::ostringstream svg;
  svg << "<figure><svg class=\"chart\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\"goodput\">"
      << "<text x=\"" << L << "\" y=\"18\" class=\"title\">where the wall time went (goodput = kept steps / wall)</text>";
  double legend_x = 8, legend_y = 28;
  for (const auto& [name, color] : parts) {
    const std::string label = std::string(name).substr(0, std::string(name).size() - 2);
    const double width = 22 + 6.4 * static_cast<double>(label.size());
    if (legend_x + width > W) legend_x = 8, legend_y += 16;  // wrap the legend
    svg << "<rect x=\"" << legend_x << "\" y=\"" << legend_y << "\" width=\"10\" height=\"10\" fill=\"" << color << "\"/><text x=\""
        << legend_x + 13 << "\" y=\"" << legend_y + 9 << "\" class=\"legend\">" << label << "</text>";
    legend_x += width;
  }
  for (size_t i = 0; i < supervised.size(); ++i) {
    const json& f = *supervised[i]->finish;
    const double wall = num(f, "wall_s"), y = legend_y + 22 + bar * 1.6 * static_cast<double>(i);
    svg << "<text x=\"" << L - 6 << "\" y=\"" << y + bar * 0.7 << "\" class=\"ytick\">" << escape(supervised[i]->name) << "</text>";
    double x = L;
    for (const auto& [name, color] : parts) {
      const double seconds = num(f, name), width = seconds / wall * (W - L - R);
      if (!(width > 0)) continue;
      svg << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << width << "\" height=\"" << bar << "\" fill=\"" << color << "\"><title>"
          << name << " " << number(seconds) << " s of " << number(wall) << " s</title></rect>";
      x += width;
    }
  }
  svg << "</svg></figure>\n";
  return svg.str();
}

}  // namespace

int run_report(const Args& args) {
  allow_only(args, {"-o", "--output"});
  if (args.positional.empty()) throw UserError("strata report needs at least one run directory; see strata report --help");
  std::vector<Run> runs;
  for (const auto& dir : args.positional) runs.push_back(load_run(dir));
  // Runs are named by their directory's name, or by the whole path where two names are alike.
  for (auto& run : runs) run.name = run.dir.filename().empty() ? run.dir.parent_path().filename().string() : run.dir.filename().string();
  for (auto& run : runs)
    if (std::count_if(runs.begin(), runs.end(), [&](const Run& other) { return other.name == run.name; }) > 1) run.name = run.dir.string();

  std::vector<Series> loss = field_series(runs, "loss");
  for (auto& s : field_series(runs, "val_loss", 1.0, " (validation)", /*dashed=*/true)) loss.push_back(std::move(s));
  std::vector<Series> throughput;
  for (size_t i = 0; i < runs.size(); ++i) {
    Series s{runs[i].name, kColors[i % std::size(kColors)], false, {}};
    for (const auto& [step, r] : runs[i].steps)
      if (const double ms = num(r, "step_ms"), tokens = num(r, "tokens"); ms > 0 && std::isfinite(tokens))
        s.points.emplace_back(static_cast<double>(step), tokens / (ms / 1000.0));
    if (!s.points.empty()) throughput.push_back(std::move(s));
  }

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>strata report</title><style>\n"
          "body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}\n"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\n"
          ".swatch{display:inline-block;width:10px;height:10px;margin-right:6px}.charts{display:flex;flex-wrap:wrap;gap:12px}\n"
          "figure{margin:0}.chart{width:560px;background:#fff}.title{font-weight:600;font-size:13px}.legend{font-size:11px}\n"
          ".grid{stroke:#eee}.frame{fill:none;stroke:#999}.ytick{font-size:10px;text-anchor:end}.xtick{font-size:10px;text-anchor:middle}\n"
          "pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:400px}\n"
          "</style></head><body>\n<h1>strata report: "
       << runs.size() << " run" << (runs.size() == 1 ? "" : "s") << "</h1>\n"
       << summary_table(runs) << "<h2>Curves</h2>\n<div class=\"charts\">\n"
       << chart("loss (dashed: validation)", "", loss) << chart("learning rate", "", field_series(runs, "lr"))
       << chart("throughput", "tokens/s", throughput) << chart("step time", "ms", field_series(runs, "step_ms"))
       << chart("peak memory", "MiB", field_series(runs, "mem_peak_bytes", 1.0 / (1 << 20)))
       << chart("gradient norm", "", field_series(runs, "grad_norm"))
       << chart("checkpoint blocking", "ms", field_series(runs, "checkpoint_ms")) << "</div>\n<h2>Goodput</h2>\n"
       << goodput_chart(runs) << "<h2>Strategies</h2>\n";
  for (const auto& run : runs)
    html << "<details><summary>" << escape(run.name) << " (" << escape(run.dir.string()) << ")</summary><pre>"
         << escape(run.strategy.empty() ? "(no strategy.toml)" : run.strategy) << "</pre></details>\n";
  html << "</body></html>\n";

  const fs::path out = args.output.empty() ? fs::path("report.html") : fs::path(args.output);
  std::ofstream file(out);
  if (!(file << html.str())) throw UserError("cannot write " + out.string());
  std::cout << "wrote " << out.string() << " (" << runs.size() << " run" << (runs.size() == 1 ? "" : "s") << ")\n";
  return 0;
}

}  // namespace strata::cli
