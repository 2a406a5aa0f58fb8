// Writing a resolved strategy back as TOML: every key with its value, defaults included.
#include <filesystem>
#include <sstream>

#include "strata/core/trainer.h"

namespace strata {

namespace {

void write_section(std::ostringstream& out, const std::string& header, const Config& config, const Schema& schema) {
  out << header << "\n";
  for (const auto& spec : schema.keys())
    if (config.has(spec.key)) out << spec.key << " = " << value_to_toml(config.entry(spec.key).value) << "\n";
  out << "\n";
}

Schema with(const Schema& base, const Component* component) {
  Schema out = base;
  if (component)
    for (const auto& spec : component->info().schema.keys()) out.add(spec);
  return out;
}

void write_raw_section(std::ostringstream& out, const std::string& header, const RawSection& section) {
  out << header << "\n";
  for (const auto& [key, entry] : section.entries) out << key << " = " << value_to_toml(entry.value) << "\n";
  out << "\n";
}

}  // namespace

std::string raw_strategy_toml(const RawStrategy& strategy, const std::string& header) {
  std::ostringstream out;
  out << header << "\n";
  RawSection job = strategy.job;
  if (const RawEntry* path = job.find("plugin_path"); path && std::holds_alternative<StringList>(path->value)) {
    RawEntry absolute = *path;
    absolute.value = StringList{};
    for (const auto& p : strategy_plugin_path(strategy))
      std::get<StringList>(absolute.value).push_back(std::filesystem::absolute(p).lexically_normal().string());
    job.set("plugin_path", absolute);
  }
  write_raw_section(out, "[job]", job);
  write_raw_section(out, "[model]", strategy.model);
  write_raw_section(out, "[data]", strategy.data);
  write_raw_section(out, "[optimizer]", strategy.optimizer);
  if (!strategy.parallel.entries.empty()) write_raw_section(out, "[parallel]", strategy.parallel);
  for (const auto& pass : strategy.passes) write_raw_section(out, "[[pass]]", pass);
  return out.str();
}

std::string resolved_strategy_toml(const ResolvedStrategy& plan) {
  std::ostringstream out;
  out << "# Resolved from " << plan.file << " by strata: every key, defaults included.\n\n";
  // plugin_path entries were relative to the original strategy file; make them absolute here.
  Config job = plan.job;
  StringList plugin_path;
  const auto base = std::filesystem::absolute(std::filesystem::path(plan.file)).parent_path();
  for (const auto& p : job.get_strings("plugin_path"))
    plugin_path.push_back(std::filesystem::path(p).is_absolute() ? p : (base / p).lexically_normal().string());
  job.set("plugin_path", Config::Entry{plugin_path, job.entry("plugin_path").origin, {}});
  write_section(out, "[job]", job, job_schema());
  write_section(out, "[model]", plan.model, plan.model_component->info().schema);
  write_section(out, "[data]", plan.data, plan.dataset_component->info().schema);
  write_section(out, "[optimizer]", plan.optimizer, with(optimizer_common_schema(), plan.optimizer_component));
  write_section(out, "[parallel]", plan.parallel, parallel_schema());
  for (const auto& pass : plan.passes) {
    out << "[[pass]]\nname = \"" << pass.pass->name() << "\"\nenabled = " << (pass.enabled ? "true" : "false") << "\n";
    for (const auto& spec : pass.pass->info().schema.keys())
      out << spec.key << " = " << value_to_toml(pass.config.entry(spec.key).value) << "\n";
    out << "\n";
  }
  return out.str();
}

}  // namespace strata
