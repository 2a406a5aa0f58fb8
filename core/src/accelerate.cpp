// The library API (strata/accelerate.h): the program's components are registered as one more
// plugin, the strategy is planned by the checks `strata plan` runs, and the Trainer `strata run`
// runs is built from the plan. Nothing here trains: the trainer's step program does.
#include "strata/accelerate.h"

#include <fstream>
#include <sstream>

#include "strata/core/launch_env.h"
#include "strata/core/plugin_loader.h"
#include "strata/core/step_plan.h"
#include "strata/core/tune.h"
#include "strata/errors.h"

namespace strata {

Strategy Strategy::from_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw UserError("cannot read strategy file " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return from_toml(text.str(), file.string());
}

Strategy Strategy::from_toml(std::string text, std::string label) {
  Strategy strategy;
  strategy.text_ = std::move(text);
  strategy.label_ = std::move(label);
  return strategy;
}

Strategy Strategy::automatic(int64_t ranks, std::string base, double memory_gb) {
  Strategy strategy = from_toml(std::move(base), "<automatic strategy>");
  strategy.automatic_ranks_ = ranks;
  strategy.memory_gb_ = memory_gb;
  return strategy;
}

Strategy& Strategy::set(std::string key_value) {
  sets_.push_back(std::move(key_value));
  return *this;
}

Strategy& Strategy::disable(std::string pass) {
  disables_.push_back(std::move(pass));
  return *this;
}

namespace {

// The program's component fills `dotted` ("job.model"); a strategy naming another is refused.
void name_component(const RawSection& section, const std::string& dotted, const std::string& name, StringList& sets) {
  const std::string key = dotted.substr(dotted.find('.') + 1);
  const RawEntry* entry = section.find(key);
  if (entry && std::holds_alternative<std::string>(entry->value) && std::get<std::string>(entry->value) != name)
    throw UserError("the strategy's " + section.label + " " + key + " = \"" + std::get<std::string>(entry->value) +
                    "\" but accelerate() was given \"" + name + "\"; leave the key out or name that one");
  sets.push_back(dotted + "=" + name);
}

// The cost model's fastest candidate that fits the memory budget.
RawStrategy automatic_choice(const RawStrategy& base, const ComponentRegistry& registry, const Strategy& strategy, int64_t world_size,
                             std::string& note) {
  if (strategy.automatic_ranks() != world_size)
    throw UserError("Strategy::automatic(" + std::to_string(strategy.automatic_ranks()) + ") is for " +
                    std::to_string(strategy.automatic_ranks()) + " ranks, but " + std::to_string(world_size) + " started");
  const TuneSpace space = generate_candidates(base, registry, world_size, HardwareRates{});
  const double budget = strategy.memory_gb() * double(1 << 30);
  for (const auto& c : space.candidates)
    if (c.rejected.empty() && (budget <= 0 || c.predicted_bytes <= budget)) {
      note = "automatic strategy: " + (c.layout.empty() ? std::string("one process") : c.layout) + ", the cost model's fastest of " +
             std::to_string(space.candidates.size()) + " candidates (predicted at default hardware rates, not measured)";
      return c.raw;
    }
  throw UserError("no candidate strategy for " + std::to_string(world_size) + " ranks plans" +
                  (budget > 0 ? " within " + std::to_string(strategy.memory_gb()) + " GB per rank" : std::string()) +
                  (space.candidates.empty() ? std::string() : "; the first refused: " + space.candidates.front().rejected));
}

}  // namespace

Accelerated accelerate(std::unique_ptr<ModelFactory> model, OptimizerSpec optimizer, std::unique_ptr<DatasetFactory> dataset,
                       LossFn loss, Strategy strategy, AccelerateOptions options) {
  Accelerated out;
  try {
    const LaunchEnv env = detect_launch_env();
    out.registry = std::make_unique<ComponentRegistry>();
    std::vector<std::filesystem::path> search{installed_plugin_dir()};
    search.insert(search.end(), options.plugin_dirs.begin(), options.plugin_dirs.end());
    PluginLoader(*out.registry).load_search_path(search);

    Diagnostics diagnostics;
    RawStrategy raw = parse_strategy_text(strategy.text(), strategy.label(), diagnostics);
    if (!diagnostics.ok()) throw UserError(diagnostics.str());
    apply_overrides(raw, strategy.sets(), strategy.disables(), diagnostics);
    if (!diagnostics.ok()) throw UserError(diagnostics.str());
    // The program's components, registered as a plugin of their own, named in the strategy.
    StringList sets;
    std::vector<std::unique_ptr<Component>> own;
    if (model) name_component(raw.job, "job.model", model->name(), sets), own.push_back(std::move(model));
    if (dataset) name_component(raw.job, "job.dataset", dataset->name(), sets), own.push_back(std::move(dataset));
    if (optimizer.custom)
      name_component(raw.optimizer, "optimizer.name", optimizer.custom->name(), sets), own.push_back(std::move(optimizer.custom));
    else if (!optimizer.name.empty())
      name_component(raw.optimizer, "optimizer.name", optimizer.name, sets);
    for (const auto& setting : optimizer.settings) sets.push_back("optimizer." + setting);
    if (!own.empty()) out.registry->register_components({"program", "", "<this program>", "", {}}, std::move(own));
    apply_overrides(raw, sets, {}, diagnostics);
    if (!diagnostics.ok()) throw UserError(diagnostics.str());
    if (strategy.automatic_ranks() > 0) raw = automatic_choice(raw, *out.registry, strategy, env.world_size, out.status);

    CheckedPlan checked;
    if (!check_plan(raw, *out.registry, env.world_size, checked, diagnostics)) throw UserError(diagnostics.str());
    out.strategy = resolved_strategy_toml(checked.plan);
    RunOptions run = options.run;
    run.loss = std::move(loss);
    out.trainer = std::make_unique<Trainer>(checked.plan, checked.order, *out.registry, std::move(run));
    out.step_program = describe_step_program(out.trainer->job().program);
    out.ok = true;
  } catch (const UserError& e) {
    out.ok = false;
    out.status = e.what();
    out.trainer.reset();
  }
  return out;
}

}  // namespace strata
