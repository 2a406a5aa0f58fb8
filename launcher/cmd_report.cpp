// strata report: one self-contained HTML file showing runs: a summary table, and curves of
// loss, validation loss, learning rate, tokens/s, step time, peak memory and checkpoint blocking,
// the runs overlaid to compare strategies, plus each run's goodput breakdown and strategy; and for
// each `strata tune` directory, predicted against measured (report_tune.cpp). The charts are
// inline SVG (svg_chart.h): the file needs no script and no network to open.
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
#include "report_tune.h"
#include "svg_chart.h"

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
  if (!fs::is_regular_file(metrics)) throw UserError(arg + " has no metrics.jsonl: not a run directory (strata run --out DIR) nor a tune's (strata tune --out DIR)");
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
      {"kept_step_s", "#2ca02c"}, {"checkpoint_blocking_s", "#1f77b4"}, {"replica_blocking_s", "#aec7e8"}, {"reload_s", "#17becf"},
      {"peer_reload_s", "#9edae5"}, {"recomputed_s", "#ff7f0e"}, {"hang_s", "#d62728"}, {"restart_s", "#9467bd"},
      {"health_check_s", "#8c564b"}, {"other_s", "#c7c7c7"}};
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
  std::vector<fs::path> tunes;
  for (const auto& dir : args.positional)
    if (is_tune_dir(dir) && !fs::is_regular_file(fs::path(dir) / "metrics.jsonl")) tunes.emplace_back(dir);
    else runs.push_back(load_run(dir));
  // Runs are named by their directory's name, or by the whole path where two names are alike.
  for (auto& run : runs) run.name = run.dir.filename().empty() ? run.dir.parent_path().filename().string() : run.dir.filename().string();
  for (auto& run : runs)
    if (std::count_if(runs.begin(), runs.end(), [&](const Run& other) { return other.name == run.name; }) > 1) run.name = run.dir.string();

  auto count = [](size_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  const std::string what = runs.empty() ? count(tunes.size(), "tune") : tunes.empty() ? count(runs.size(), "run")
                                                                                      : count(runs.size(), "run") + ", " + count(tunes.size(), "tune");
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
       << what << "</h1>\n";
  if (!runs.empty()) {
    html << summary_table(runs) << "<h2>Curves</h2>\n<div class=\"charts\">\n"
         << chart("loss (dashed: validation)", "", loss) << chart("learning rate", "", field_series(runs, "lr"))
         << chart("throughput", "tokens/s", throughput) << chart("step time", "ms", field_series(runs, "step_ms"))
         << chart("peak memory", "MiB", field_series(runs, "mem_peak_bytes", 1.0 / (1 << 20)))
         << chart("gradient norm", "", field_series(runs, "grad_norm"))
         << chart("checkpoint blocking", "ms", field_series(runs, "checkpoint_ms")) << "</div>\n<h2>Goodput</h2>\n"
         << goodput_chart(runs) << "<h2>Strategies</h2>\n";
    for (const auto& run : runs)
      html << "<details><summary>" << escape(run.name) << " (" << escape(run.dir.string()) << ")</summary><pre>"
           << escape(run.strategy.empty() ? "(no strategy.toml)" : run.strategy) << "</pre></details>\n";
  }
  for (const auto& dir : tunes) {
    std::string summary;
    html << tune_section(dir, summary);
    std::cout << summary << "\n";
  }
  html << "</body></html>\n";

  const fs::path out = args.output.empty() ? fs::path("report.html") : fs::path(args.output);
  std::ofstream file(out);
  if (!(file << html.str())) throw UserError("cannot write " + out.string());
  std::cout << "wrote " << out.string() << " (" << what << ")\n";
  return 0;
}

}  // namespace strata::cli
