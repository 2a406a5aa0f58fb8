// The tune section of `strata report`: a scatter of predicted against measured step time and peak
// memory per rank, their rank correlation and errors, and every candidate measured (tune.jsonl,
// written by cmd_tune.cpp) with its verdict. This is how a user sees whether the cost model can be
// trusted on their machine before trusting a --dry-run ranking.
#include "report_tune.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.h"
#include "strata/errors.h"
#include "svg_chart.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Ranks (0-based) of `values`, ties sharing the mean of their ranks.
std::vector<double> ranks_of(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(values.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = (static_cast<double>(i) + static_cast<double>(j)) / 2;
    i = j + 1;
  }
  return ranks;
}

// Spearman's rank correlation: the Pearson correlation of the ranks.
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() < 2) return NAN;
  const std::vector<double> ra = ranks_of(a), rb = ranks_of(b);
  const double mean = (static_cast<double>(a.size()) - 1) / 2;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < a.size(); ++i)
    cov += (ra[i] - mean) * (rb[i] - mean), va += (ra[i] - mean) * (ra[i] - mean), vb += (rb[i] - mean) * (rb[i] - mean);
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : NAN;
}

std::string join(const json& choices) {
  std::string out;
  for (const auto& c : choices) out += (out.empty() ? "" : "; ") + c.get<std::string>();
  return out.empty() ? "-" : out;
}

std::string cell(const json& record, const char* key, double scale, int precision = 4) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? number(it->get<double>() * scale, precision) : "-";
}

}  // namespace

bool is_tune_dir(const fs::path& dir) { return fs::is_regular_file(dir / "tune.jsonl"); }

std::string tune_section(const fs::path& dir, std::string& summary) {
  std::vector<json> records;
  std::ifstream in(dir / "tune.jsonl");
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object() || !record.contains("verdict"))
      throw UserError((dir / "tune.jsonl").string() + " line " + std::to_string(line_number) + " is not a strata tune record");
    records.push_back(std::move(record));
  }
  std::vector<const json*> measured, failed;
  size_t refused = 0, over = 0, planned = 0;
  const json* best = nullptr;
  for (const auto& r : records) {
    const std::string verdict = r["verdict"].get<std::string>();
    if (verdict.rfind("refused", 0) == 0) ++refused;
    else ++planned;
    if (verdict.rfind("over", 0) == 0) ++over;
    if (r.contains("measured_s")) measured.push_back(&r);
    else if (verdict.rfind("failed", 0) == 0) failed.push_back(&r);
    if (verdict.rfind("best", 0) == 0) best = &r;
  }
  std::sort(measured.begin(), measured.end(), [](const json* a, const json* b) { return a->value("predicted_rank", 0) < b->value("predicted_rank", 0); });

  std::vector<double> predicted_s, measured_s, memory_error;
  Series times{"measured", kColors[0], false, {}, true}, chosen{"chosen", kColors[1], false, {}, true};
  Series memory{"measured", kColors[0], false, {}, true};
  for (const json* r : measured) {
    predicted_s.push_back((*r)["predicted_s"].get<double>()), measured_s.push_back((*r)["measured_s"].get<double>());
    (r == best ? chosen : times).points.emplace_back(predicted_s.back() * 1e3, measured_s.back() * 1e3);
    const double pb = r->value("predicted_bytes", 0.0), mb = r->value("measured_bytes", 0.0);
    if (mb > 0) memory_error.push_back(std::abs(pb - mb) / mb), memory.points.emplace_back(pb / (1 << 20), mb / (1 << 20));
  }
  // The line where prediction equals measurement, over the memory chart's range.
  Series diagonal{"predicted = measured", "#999", true, {}};
  if (!memory.points.empty()) {
    double low = INFINITY, high = -INFINITY;
    for (const auto& [x, y] : memory.points) low = std::min({low, x, y}), high = std::max({high, x, y});
    diagonal.points = {{low, low}, {high, high}};
  }
  const double rho = spearman(predicted_s, measured_s);
  const double worst = memory_error.empty() ? NAN : *std::max_element(memory_error.begin(), memory_error.end());
  const double calibration = measured.empty() ? 0 : measured.front()->value("predicted_bytes", 0.0) - measured.front()->value("predicted_model_bytes", 0.0);

  std::ostringstream html;
  html << "<h2>strata tune: " << escape(dir.string()) << "</h2>\n<p>" << records.size() << " candidates: " << planned << " plan, "
       << refused << " refused by the plan checks, " << over << " over the memory budget; " << measured.size() << " measured, "
       << failed.size() << " failed when run.";
  if (best)
    html << " Chosen: <b>" << escape((*best)["layout"].get<std::string>()) << "</b>; " << escape(join((*best)["choices"])) << ": "
         << cell(*best, "measured_s", 1e3) << " ms per step measured (predicted rank " << best->value("predicted_rank", 0) << ").";
  html << "</p>\n<p>Predicted against measured over the " << measured.size() << " measured: step time Spearman "
       << (std::isnan(rho) ? "-" : number(rho, 3)) << "; peak memory per rank within " << (std::isnan(worst) ? "-" : number(100 * worst, 3))
       << "% (median " << (memory_error.empty() ? "-" : number(100 * median(memory_error), 3)) << "%), the first trial's calibration "
       << number(calibration / (1 << 20), 3) << " MiB included.</p>\n<div class=\"charts\">\n"
       << chart("step time: measured against predicted", "ms", {times, chosen}, "predicted ms")
       << chart("peak memory per rank: measured against predicted", "MiB", {memory, diagonal}, "predicted MiB") << "</div>\n";
  html << "<table><tr><th>predicted rank</th><th>layout</th><th>choices</th><th>predicted ms</th><th>measured ms</th><th>trials ms</th>"
          "<th>predicted MiB</th><th>measured MiB</th><th>verdict</th></tr>\n";
  std::vector<const json*> rows = measured;
  rows.insert(rows.end(), failed.begin(), failed.end());
  for (const json* r : rows) {
    std::string rounds = "-";
    if (r->contains("measured_rounds_s")) {
      rounds.clear();
      for (const auto& v : (*r)["measured_rounds_s"]) rounds += (rounds.empty() ? "" : ", ") + number(v.get<double>() * 1e3, 4);
    }
    html << "<tr><td>" << r->value("predicted_rank", 0) << "</td><td>" << escape((*r)["layout"].get<std::string>()) << "</td><td>"
         << escape(join((*r)["choices"])) << "</td><td>" << cell(*r, "predicted_s", 1e3) << "</td><td>" << cell(*r, "measured_s", 1e3)
         << "</td><td>" << rounds << "</td><td>" << cell(*r, "predicted_bytes", 1.0 / (1 << 20), 5) << "</td><td>"
         << cell(*r, "measured_bytes", 1.0 / (1 << 20), 5) << "</td><td>" << escape((*r)["verdict"].get<std::string>()) << "</td></tr>\n";
  }
  html << "</table>\n";
  summary = dir.string() + ": " + std::to_string(measured.size()) + " measured of " + std::to_string(planned) +
            " that plan; predicted vs measured step time Spearman " + (std::isnan(rho) ? "-" : number(rho, 3)) +
            ", peak memory within " + (std::isnan(worst) ? "-" : number(100 * worst, 3)) + "%";
  return html.str();
}

}  // namespace strata::cli
