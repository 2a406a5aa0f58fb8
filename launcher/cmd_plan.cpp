// strata plan: the resolved strategy and pass order, or every error in it.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "strata/core/step_plan.h"
#include "strata/model.h"
#include "strata/pass.h"
#include "common.h"
#include "strategy_input.h"

namespace strata::cli {

namespace {

std::string origin_note(const Config::Entry& entry) {
  switch (entry.origin) {
    case Origin::Default: return "default";
    case Origin::File: return entry.pos.line ? "line " + std::to_string(entry.pos.line) : entry.pos.file;  // 0: a file it was read from
    case Origin::CommandLine: return entry.pos.file;
  }
  return "";
}

std::string component_note(const ComponentRegistry& registry, const Component* component) {
  if (!component) return "";
  const PluginRecord* plugin = registry.plugin_of(component);
  return std::string("  (") + component_kind_name(component->kind()) + " '" + component->name() + "' from plugin " +
         (plugin ? plugin->name + " " + plugin->version : "?") + ")";
}

void print_config(const Config& config, const Schema& schema, const std::string& indent) {
  size_t width = 0;
  for (const auto& spec : schema.keys()) width = std::max(width, spec.key.size());
  for (const auto& spec : schema.keys()) {
    if (!config.has(spec.key)) continue;
    const auto& entry = config.entry(spec.key);
    std::string line = indent + spec.key + std::string(width - spec.key.size(), ' ') + " = " + value_to_toml(entry.value);
    line.resize(std::max<size_t>(line.size() + 2, 48), ' ');
    std::cout << line << "# " << origin_note(entry) << "\n";
  }
}

Schema optimizer_schema(const ResolvedStrategy& plan) {
  Schema schema = optimizer_common_schema();
  if (plan.optimizer_component)
    for (const auto& spec : plan.optimizer_component->info().schema.keys()) schema.add(spec);
  return schema;
}

toml::table config_json(const Config& config) {
  toml::table table;
  for (const auto& [key, entry] : config.entries()) insert_value(table, key, entry.value);
  return table;
}

toml::table step_program_json(const StepProgram& program) {
  toml::table out;
  for (Stage stage : kAllStages) {
    toml::array wrappers;
    for (const auto& w : program.wrappers(stage)) wrappers.push_back(w);
    out.insert(stage_name(stage), toml::table{{"provider", program.provider(stage)}, {"wrappers", std::move(wrappers)}});
  }
  return out;
}

void print_json_plan(const ResolvedStrategy& plan, const std::vector<size_t>& order, const std::vector<std::string>& notes) {
  const ParallelLayout& l = plan.layout;
  toml::array unread;
  for (const auto& note : notes) unread.push_back(note);
  toml::array layout_order;
  for (const auto& d : l.order) layout_order.push_back(d);
  toml::array passes, disabled;
  for (size_t i : order) {
    const PassEntry& p = plan.passes[i];
    passes.push_back(toml::table{{"name", p.pass->name()}, {"phase", phase_name(p.pass->ordering().phase)},
                                 {"config", config_json(p.config)}});
  }
  for (const auto& p : plan.passes)
    if (!p.enabled) disabled.push_back(p.pass->name());
  print_json(toml::table{
      {"strategy", plan.file},
      {"world_size", l.world_size},
      {"layout", toml::table{{"data", l.mesh.data}, {"tensor", l.mesh.tensor}, {"pipeline", l.mesh.pipeline}, {"context", l.mesh.context},
                             {"expert", l.mesh.expert}, {"order", std::move(layout_order)}}},
      {"job", config_json(plan.job)},
      {"model", config_json(plan.model)},
      {"data", config_json(plan.data)},
      {"optimizer", config_json(plan.optimizer)},
      {"parallel", config_json(plan.parallel)},
      {"passes", std::move(passes)},
      {"disabled_passes", std::move(disabled)},
      {"unread_keys", std::move(unread)},
      {"step_program", step_program_json(planned_step_program(plan, order))}});
}

void print_text_plan(const ResolvedStrategy& plan, const std::vector<size_t>& order, const ComponentRegistry& registry) {
  const ParallelLayout& l = plan.layout;
  std::cout << "Strategy " << plan.file << ", world size " << l.world_size << "\n";
  std::cout << "Layout: data " << l.mesh.data << " x tensor " << l.mesh.tensor << " x pipeline " << l.mesh.pipeline << " x context "
            << l.mesh.context << "; rank order (innermost first) " << value_to_toml(Value{l.order}) << "\n";
  auto section = [&](const std::string& title, const Config& config, const Schema& schema, const Component* c) {
    std::cout << "\n[" << title << "]" << component_note(registry, c) << "\n";
    print_config(config, schema, "  ");
  };
  section("job", plan.job, job_schema(), nullptr);
  section("model", plan.model, plan.model_component->info().schema, plan.model_component);
  section("data", plan.data, plan.dataset_component->info().schema, plan.dataset_component);
  section("optimizer", plan.optimizer, optimizer_schema(plan), plan.optimizer_component);
  section("parallel", plan.parallel, parallel_schema(), nullptr);

  std::cout << "\nPasses in the order they apply:\n";
  if (order.empty()) std::cout << "  (none)\n";
  for (size_t n = 0; n < order.size(); ++n) {
    const PassEntry& p = plan.passes[order[n]];
    std::cout << "  " << n + 1 << ". " << p.pass->name() << "  [" << phase_name(p.pass->ordering().phase) << "]"
              << component_note(registry, p.pass) << "\n";
    print_config(p.config, p.pass->info().schema, "       ");
  }
  for (const auto& p : plan.passes)
    if (!p.enabled) std::cout << "Disabled: " << p.pass->name() << " (" << p.pos.str() << ")\n";

  std::cout << "\nMesh dimensions and the passes that claim them:\n";
  for (Dim dim : {Dim::Data, Dim::Tensor, Dim::Pipeline, Dim::Context, Dim::Expert}) {
    std::string claimant;
    for (size_t i : order)
      for (Dim d : plan.passes[i].pass->claims().dims)
        if (d == dim) claimant = plan.passes[i].pass->name();
    const int64_t size = dim == Dim::Data       ? l.mesh.data
                         : dim == Dim::Tensor   ? l.mesh.tensor
                         : dim == Dim::Pipeline ? l.mesh.pipeline
                         : dim == Dim::Context  ? l.mesh.context
                                                : l.mesh.expert;
    std::cout << "  " << dim_name(dim) << std::string(10 - std::string(dim_name(dim)).size(), ' ') << size << "  "
              << (claimant.empty() ? (size > 1 ? "UNCLAIMED" : "-") : "pass " + claimant) << "\n";
  }
  if (l.mesh.tensor > 1)
    if (const std::string split = static_cast<const ModelFactory*>(plan.model_component)->describe_split(plan.model, l.mesh.tensor);
        !split.empty()) {
      std::cout << "\nWhat each of the " << l.mesh.tensor << " tensor ranks holds of the model:\n";
      std::istringstream lines(split);
      for (std::string line; std::getline(lines, line);) std::cout << "  " << line << "\n";
    }
  for (size_t i : order) {
    const PassEntry& p = plan.passes[i];
    const std::string text = p.pass->describe_plan(p.config, plan_facts(plan));
    if (!text.empty()) std::cout << "\n" << text;
  }
  std::cout << "\nStep program (stages in the order one optimizer step runs them; evaluate every [job] eval_every):\n"
            << describe_step_program(planned_step_program(plan, order));
}

}  // namespace

int run_plan(const Args& args) {
  allow_only(args, {"--json", "--set", "--disable", "-n", "--ranks"});
  ComponentRegistry registry;
  LoadedPlan loaded;
  if (!load_plan(args, args.ranks, registry, loaded)) return 2;
  if (args.json)
    print_json_plan(loaded.plan, loaded.order, loaded.unread_notes);
  else
    print_text_plan(loaded.plan, loaded.order, registry);
  // On standard error, so --json output stays one document.
  for (const std::string& note : loaded.unread_notes) std::cerr << "note: " << note << "\n";
  if (!loaded.data_not_checked.empty())
    std::cerr << "note: the data was not checked against the model and batch (" << loaded.data_not_checked
              << "); training will need it\n";
  return 0;
}

}  // namespace strata::cli
