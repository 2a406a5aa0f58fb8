// Checking raw sections against schemas and filling in defaults.
#include <algorithm>
#include <cmath>
#include <set>

#include "strata/core/strategy.h"
#include "strata/core/prepared_data.h"
#include "components_from_files.h"
#include "tokenizer_check.h"

#include <filesystem>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include "strata/data.h"
#include "strata/model.h"
#include "strata/errors.h"

namespace strata {

namespace {

std::string describe_value(const Value& value) {
  static const char* names[] = {"boolean", "integer", "number", "string", "list"};
  return std::string(names[value.index()]) + " " + value_to_toml(value);
}

std::string format_bound(double bound) {
  return bound == std::floor(bound) && std::abs(bound) < 1e15 ? std::to_string(static_cast<int64_t>(bound))
                                                              : value_to_toml(Value{bound});
}

// Checks one value against its spec; returns the value to store (ints widen to floats).
std::optional<Value> check_value(const KeySpec& spec, const Value& value, std::string& why) {
  if (spec.allow_auto) {
    if (const auto* s = std::get_if<std::string>(&value); s && *s == kAuto) return value;
  }
  Value stored = value;
  bool type_ok = false;
  switch (spec.type) {
    case ValueType::Bool: type_ok = std::holds_alternative<bool>(value); break;
    case ValueType::Int: type_ok = std::holds_alternative<int64_t>(value); break;
    case ValueType::Float:
      if (const auto* i = std::get_if<int64_t>(&value)) stored = static_cast<double>(*i);
      type_ok = std::holds_alternative<double>(stored);
      break;
    case ValueType::String: type_ok = std::holds_alternative<std::string>(value); break;
    case ValueType::StringList: type_ok = std::holds_alternative<StringList>(value); break;
  }
  if (!type_ok) {
    why = std::string("expects ") + (spec.allow_auto ? "an integer or \"auto\"" : value_type_name(spec.type)) +
          ", got " + describe_value(value);
    return std::nullopt;
  }
  if (spec.type == ValueType::Int || spec.type == ValueType::Float) {
    double x = spec.type == ValueType::Int ? static_cast<double>(std::get<int64_t>(stored)) : std::get<double>(stored);
    if (!std::isfinite(x)) {
      why = "must be a finite number, got " + value_to_toml(stored);
      return std::nullopt;
    }
    if ((spec.min && !(x >= *spec.min)) || (spec.max && !(x <= *spec.max))) {
      why = "must be " + (spec.min && spec.max ? "between " + format_bound(*spec.min) + " and " + format_bound(*spec.max)
                          : spec.min          ? ">= " + format_bound(*spec.min)
                                              : "<= " + format_bound(*spec.max)) +
            ", got " + value_to_toml(stored);
      return std::nullopt;
    }
  }
  if (!spec.choices.empty()) {
    StringList given = spec.type == ValueType::StringList ? std::get<StringList>(stored)
                                                          : StringList{std::get<std::string>(stored)};
    for (const auto& g : given)
      if (std::find(spec.choices.begin(), spec.choices.end(), g) == spec.choices.end()) {
        why = "does not accept \"" + g + "\"; choose from " + value_to_toml(Value{spec.choices});
        return std::nullopt;
      }
  }
  return stored;
}

std::vector<std::string> key_names(const Schema& schema) {
  std::vector<std::string> out;
  for (const auto& spec : schema.keys()) out.push_back(spec.key);
  return out;
}

// `owner` names whose keys these are in messages, e.g. "[job]" or "model 'gpt' in [model]".
Config validate_section(const RawSection& section, const Schema& schema, const std::string& owner,
                        Diagnostics& diagnostics) {
  Config config;
  for (const auto& [key, entry] : section.entries) {
    const KeySpec* spec = schema.find(key);
    if (!spec) {
      std::string hint = did_you_mean(key, key_names(schema));
      diagnostics.error(entry.pos, "unknown key '" + key + "' for " + owner + (hint.empty() ? "" : "; " + hint));
      continue;
    }
    std::string why;
    if (auto stored = check_value(*spec, entry.value, why))
      config.set(key, Config::Entry{std::move(*stored), entry.origin, entry.pos});
    else
      diagnostics.error(entry.pos, "key '" + key + "' of " + owner + " " + why);
  }
  for (const auto& spec : schema.keys()) {
    if (config.has(spec.key) || section.find(spec.key)) continue;
    if (spec.default_value)
      config.set(spec.key, Config::Entry{*spec.default_value, Origin::Default, {}});
    else
      diagnostics.error(section.pos, owner + " needs key '" + spec.key + "' (" + spec.doc + ")");
  }
  return config;
}

Schema merged(const Schema& a, const Schema& b, const std::string& b_owner, const SourcePos& pos, Diagnostics& diagnostics) {
  Schema out = a;
  for (const auto& spec : b.keys()) {
    if (out.find(spec.key))
      diagnostics.error(pos, b_owner + " declares key '" + spec.key + "', which core already defines");
    else
      out.add(spec);
  }
  return out;
}

// Sets `key` to a value derived for it (strata/component.h: DerivesDefaults) where the section
// left it at its default; the value passes the key's schema check as a written one does, and a
// failure names the file it came from. Returns whether it set the key.
bool set_derived(const DerivesDefaults::Derived& derived, const Schema& schema, const std::string& owner, Config& config,
                 Diagnostics& diagnostics) {
  const KeySpec* spec = schema.find(derived.key);
  if (!spec || !config.has(derived.key) || config.entry(derived.key).origin != Origin::Default) return false;
  std::string why;
  std::optional<Value> stored = check_value(*spec, derived.value, why);
  if (!stored) {
    diagnostics.error(derived.source, "key '" + derived.key + "' of " + owner + ", taken from here, " + why);
    return false;
  }
  if (*stored == config.entry(derived.key).value) return false;
  config.set(derived.key, Config::Entry{std::move(*stored), Origin::File, derived.source});
  return true;
}

// Fills the keys the section leaves at their defaults: first those the component derives, asked
// again after each change (a derived key may imply others), then `fallbacks`.
void fill_derived_defaults(const Component& component, const Schema& schema, const std::string& owner,
                           const std::vector<DerivesDefaults::Derived>& fallbacks, Config& config, Diagnostics& diagnostics) {
  if (const auto* derives = dynamic_cast<const DerivesDefaults*>(&component)) {
    // Each round sets at least one key that was at its default, so the rounds end; a value the
    // schema refuses ends them too (asked again, the component would derive it again).
    const size_t before = diagnostics.items().size();
    for (bool changed = true; changed && diagnostics.items().size() == before;) {
      changed = false;
      for (const auto& derived : derives->derived_defaults(config)) changed |= set_derived(derived, schema, owner, config, diagnostics);
    }
  }
  for (const auto& derived : fallbacks) set_derived(derived, schema, owner, config, diagnostics);
}

// Resolves a section that belongs to the component named by `name_key` in `chooser`.
const Component* resolve_component_section(ComponentKind kind, const Config& chooser, const std::string& chooser_label,
                                           const std::string& name_key, const RawSection& section,
                                           const Schema* common, const ComponentRegistry& registry, Config& out,
                                           Diagnostics& diagnostics, const std::vector<DerivesDefaults::Derived>& fallbacks = {}) {
  if (!chooser.has(name_key)) return nullptr;  // already reported as missing
  const std::string& name = chooser.get_string(name_key);
  const std::string kind_name = component_kind_name(kind);
  const Component* component = registry.find(kind, name);
  if (!component) {
    std::vector<std::string> known = registry.names(kind);
    std::string hint = did_you_mean(name, known);
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    diagnostics.error(chooser.entry(name_key).pos.line ? chooser.entry(name_key).pos : section.pos,
                      "unknown " + kind_name + " '" + name + "' in " + chooser_label + " " + name_key +
                          (hint.empty() ? "" : "; " + hint) + " (registered: " + (list.empty() ? "none" : list) + ")");
    return nullptr;
  }
  const std::string owner = kind_name + " '" + name + "' in " + section.label;
  size_t before = diagnostics.items().size();
  const Schema schema = common ? merged(*common, component->info().schema, kind_name + " '" + name + "'", section.pos, diagnostics)
                               : component->info().schema;
  out = validate_section(section, schema, owner, diagnostics);
  if (diagnostics.items().size() == before) fill_derived_defaults(*component, schema, owner, fallbacks, out, diagnostics);
  if (diagnostics.items().size() == before) component->validate(out, section.pos, diagnostics);
  return component;
}

// The entries of `section` whose keys `schema` declares (or, with keep = false, does not).
RawSection keys_in(const RawSection& section, const Schema& schema, bool keep) {
  RawSection out{section.label, section.pos, {}};
  for (const auto& [key, entry] : section.entries)
    if ((schema.find(key) != nullptr) == keep) out.entries.emplace_back(key, entry);
  return out;
}

ParallelLayout resolve_layout(const Config& parallel, const SourcePos& pos, int64_t world_size, Diagnostics& diagnostics) {
  ParallelLayout layout;
  layout.world_size = world_size;
  if (!parallel.has("tensor") || !parallel.has("pipeline") || !parallel.has("context") || !parallel.has("data") ||
      !parallel.has("order"))
    return layout;  // a bad key was reported already
  layout.mesh.tensor = parallel.get_int("tensor");
  layout.mesh.pipeline = parallel.get_int("pipeline");
  layout.mesh.context = parallel.get_int("context");
  layout.order = parallel.get_strings("order");
  StringList sorted = layout.order;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != StringList{"context", "data", "pipeline", "tensor"})
    diagnostics.error(parallel.entry("order").pos.line ? parallel.entry("order").pos : pos,
                      "[parallel] order must name tensor, context, pipeline and data once each, got " +
                          value_to_toml(Value{layout.order}));
  const int64_t model_parallel = layout.mesh.tensor * layout.mesh.pipeline * layout.mesh.context;
  const std::string sizes = "tensor " + std::to_string(layout.mesh.tensor) + " x pipeline " + std::to_string(layout.mesh.pipeline) +
                            " x context " + std::to_string(layout.mesh.context);
  if (parallel.is_auto("data")) {
    if (world_size % model_parallel != 0) {
      diagnostics.error(pos, "[parallel] " + sizes + " = " + std::to_string(model_parallel) +
                                 " does not divide the world size " + std::to_string(world_size));
      return layout;
    }
    layout.mesh.data = world_size / model_parallel;
  } else {
    layout.mesh.data = parallel.get_int("data");
    if (layout.mesh.data * model_parallel != world_size)
      diagnostics.error(parallel.entry("data").pos.line ? parallel.entry("data").pos : pos,
                        "[parallel] data " + std::to_string(layout.mesh.data) + " x " + sizes + " = " +
                            std::to_string(layout.mesh.data * model_parallel) + " ranks, but the world size is " +
                            std::to_string(world_size) + "; set data = \"auto\" or change the sizes");
  }
  if (parallel.has("expert")) {
    layout.mesh.expert = parallel.get_int("expert");
    if (layout.mesh.data % layout.mesh.expert != 0)
      diagnostics.error(parallel.entry("expert").pos.line ? parallel.entry("expert").pos : pos,
                        "[parallel] expert " + std::to_string(layout.mesh.expert) + " does not divide the data size " +
                            std::to_string(layout.mesh.data) + " (experts split over groups of data ranks)");
  }
  return layout;
}

// [data] path and [model] init_from name files relative to the working directory. The plan holds
// them absolute, so the strategy.toml a run saves reruns, resumes, exports and samples from any
// directory ([job] plugin_path, relative to the strategy file, is made absolute where it is
// written). A URL is left as it is.
void make_path_absolute(Config& section, const std::string& key) {
  if (!section.has(key)) return;
  Config::Entry entry = section.entry(key);
  const auto* path = std::get_if<std::string>(&entry.value);
  if (!path || path->empty() || path->find("://") != std::string::npos || std::filesystem::path(*path).is_absolute()) return;
  entry.value = std::filesystem::absolute(*path).lexically_normal().string();
  section.set(key, std::move(entry));
}
}  // namespace

Config without_init_from(const Config& model) {
  Config out = model;
  if (out.has("init_from")) out.set("init_from", Config::Entry{std::string(), Origin::Default, {}});
  return out;
}

int64_t model_context(const Config& model, int64_t seq_len) {
  const int64_t stated = model.has("max_positions") ? model.get_int("max_positions") : 0;
  return stated > 0 ? stated : seq_len;
}

ResolvedStrategy resolve_strategy(const RawStrategy& raw, const ComponentRegistry& registry, int64_t world_size,
                                  Diagnostics& diagnostics) {
  ResolvedStrategy out;
  out.file = raw.file;
  out.data_pos = raw.data.pos.line ? raw.data.pos : SourcePos{raw.file, 0, 0};
  RawSection job = raw.job;
  choose_components_from_files(job, raw.model, raw.data, registry);
  out.job = validate_section(job, job_schema(), "[job]", diagnostics);
  out.parallel = validate_section(raw.parallel, parallel_schema(), "[parallel]", diagnostics);
  out.layout = resolve_layout(out.parallel, raw.parallel.pos.line ? raw.parallel.pos : SourcePos{raw.file, 0, 0},
                              world_size, diagnostics);

  RawSection data = raw.data;
  const std::vector<DerivesDefaults::Derived> model_from_data = apply_prepared_data(out.job, registry, data, diagnostics);
  check_data_tokenizer_matches_weights(out.job, raw.model, raw.data, diagnostics);
  out.model_component = resolve_component_section(ComponentKind::Model, out.job, "[job]", "model", raw.model, nullptr,
                                                  registry, out.model, diagnostics, model_from_data);
  out.dataset_component = resolve_component_section(ComponentKind::Dataset, out.job, "[job]", "dataset", data,
                                                    nullptr, registry, out.data, diagnostics);
  make_path_absolute(out.model, "init_from");
  make_path_absolute(out.data, "path");
  // [optimizer] chooses its own component with its `name` key.
  static const Schema optimizer_name = Schema().string("name", "adamw", "");
  Config optimizer_choice = validate_section(keys_in(raw.optimizer, optimizer_name, true), optimizer_name, "[optimizer]", diagnostics);
  out.optimizer_component = resolve_component_section(ComponentKind::Optimizer, optimizer_choice, "[optimizer]", "name",
                                                      raw.optimizer, &optimizer_common_schema(), registry,
                                                      out.optimizer, diagnostics);

  std::map<std::string, SourcePos> first_seen;
  for (const auto& section : raw.passes) {
    Config common = validate_section(keys_in(section, pass_common_schema(), true), pass_common_schema(), section.label, diagnostics);
    if (!common.has("name") || !common.has("enabled")) continue;  // a bad key was reported already
    const std::string& name = common.get_string("name");
    const Pass* pass = registry.find_pass(name);
    if (!pass) {
      std::string hint = did_you_mean(name, registry.names(ComponentKind::Pass));
      diagnostics.error(common.entry("name").pos, "unknown pass '" + name + "'" + (hint.empty() ? "" : "; " + hint) +
                                                      " (see `strata plugins` for the registered passes)");
      continue;
    }
    if (auto [it, inserted] = first_seen.emplace(name, section.pos); !inserted) {
      diagnostics.error(section.pos, "pass '" + name + "' appears twice (first at " + it->second.str() + ")");
      continue;
    }
    RawSection own = keys_in(section, pass_common_schema(), false);
    size_t before = diagnostics.items().size();
    PassEntry entry{pass, common.get_bool("enabled"), validate_section(own, pass->info().schema, "pass '" + name + "'", diagnostics),
                    section.pos};
    if (diagnostics.items().size() == before) pass->validate(entry.config, section.pos, diagnostics);
    out.passes.push_back(std::move(entry));
  }
  // The micro-batches a data-parallel rank runs per step, computed here once for every reader.
  if (out.job.has("global_batch") && out.job.has("micro_batch")) {
    const int64_t local_batch = out.job.get_int("global_batch") / std::max<int64_t>(1, out.layout.mesh.data), micro_batch = micro_batch_size(out);
    out.layout.mesh.micro_batches = micro_batch > 0 ? std::max<int64_t>(1, local_batch / micro_batch) : 1;
  }
  return out;
}

int64_t micro_batch_size(const ResolvedStrategy& plan) {
  const int64_t local_batch = plan.job.get_int("global_batch") / std::max<int64_t>(1, plan.layout.mesh.data);
  return plan.job.get_int("micro_batch") > 0 ? plan.job.get_int("micro_batch") : local_batch;
}

PlanFacts plan_facts(const ResolvedStrategy& plan) {
  PlanFacts facts{plan.job, plan.model, *static_cast<const ModelFactory*>(plan.model_component), plan.layout.mesh};
  try {
    facts.device = c10::Device(plan.job.get_string("device")).type();
  } catch (const c10::Error&) {
    // [job] device is checked when the job starts; the plan's checks assume the CPU meanwhile.
  }
  for (const auto& entry : plan.passes)
    if (entry.enabled) facts.enabled_passes.push_back(entry.pass->name());
  for (const auto& entry : plan.passes)
    if (entry.enabled)
      if (const auto dtype = entry.pass->compute_dtype(entry.config)) {
        facts.compute_dtype = *dtype;
        facts.compute_dtype_by = entry.pass->name();
      }
  return facts;
}

void check_sizes(const ResolvedStrategy& plan, Diagnostics& diagnostics) {
  if (!diagnostics.ok()) return;  // sizes of a strategy with errors mean nothing
  const int64_t global_batch = plan.job.get_int("global_batch"), micro_batch = plan.job.get_int("micro_batch");
  const int64_t dp = plan.layout.mesh.data;
  const SourcePos& batch_pos = plan.job.entry("global_batch").pos;
  if (dp < 1) return;  // the layout was refused already
  if (plan.job.get_int("rank_memory_limit_mb") > 0 && plan.job.get_string("host_memory") == "keep")
    diagnostics.error(plan.job.entry("rank_memory_limit_mb").pos,
                      "[job] rank_memory_limit_mb needs host_memory = \"return\" or \"cache\": \"keep\" holds what a step frees "
                      "in the heap, which the cap would count as allocated");
  if (global_batch % dp != 0) {
    diagnostics.error(batch_pos, "[job] global_batch " + std::to_string(global_batch) + " does not split over " + std::to_string(dp) +
                                     " data-parallel ranks");
    return;
  }
  if (micro_batch > 0 && (global_batch / dp) % micro_batch != 0)
    diagnostics.error(plan.job.entry("micro_batch").pos, "[job] global_batch " + std::to_string(global_batch) + " / " +
                                                              std::to_string(dp) + " data-parallel ranks is not a multiple of micro_batch " +
                                                              std::to_string(micro_batch));
  if (!plan.dataset_component || !plan.model_component) return;
  if (plan.layout.mesh.tensor > 1)
    if (const std::string problem = static_cast<const ModelFactory*>(plan.model_component)->split_problem(plan.model, plan.layout.mesh.tensor);
        !problem.empty())
      diagnostics.error(plan.parallel.has("tensor") && !plan.parallel.entry("tensor").pos.file.empty() ? plan.parallel.entry("tensor").pos
                                                                                                        : SourcePos{plan.file, 0, 0},
                        problem);
  const MeshSizes mesh = plan.layout.mesh;
  for (const auto& entry : plan.passes)
    if (entry.enabled)
      if (const std::string problem = entry.pass->size_problem(entry.config, plan.model, mesh); !problem.empty())
        diagnostics.error(entry.pos, problem);
  const PlanFacts facts = plan_facts(plan);
  for (const auto& entry : plan.passes)
    if (entry.enabled)
      if (const std::string problem = entry.pass->plan_problem(entry.config, facts); !problem.empty())
        diagnostics.error(entry.pos, problem);
}

}  // namespace strata
