// The candidate strategies of `strata tune` (strata/core/tune.h): every axis comes from what the
// loaded passes declare, every candidate is checked by the checks `strata plan` runs.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "strata/core/operator_table.h"
#include "strata/core/pass_manager.h"
#include "strata/core/trainer.h"
#include "strata/core/tune.h"
#include "strata/pass.h"

namespace strata {

namespace {

// The mesh a candidate sizes: the four dimensions whose product is the world size, then expert,
// a factor of data (experts split over groups of data ranks).
constexpr Dim kDims[] = {Dim::Data, Dim::Tensor, Dim::Pipeline, Dim::Context, Dim::Expert};
constexpr size_t kWorldDims = 4, kExpert = 4;

std::string section_pass_name(const RawSection& section) {
  const RawEntry* name = section.find("name");
  return name && std::holds_alternative<std::string>(name->value) ? std::get<std::string>(name->value) : std::string();
}

bool section_enabled(const RawSection& section) {
  const RawEntry* enabled = section.find("enabled");
  return !enabled || !std::holds_alternative<bool>(enabled->value) || std::get<bool>(enabled->value);
}

// One searched key: where it goes and the values tried.
struct Axis {
  std::string pass;  // empty: [job]
  std::string key;
  std::vector<Value> values;
};

// What tune compares of two plans' estimates: the step's predicted memory and work.
bool same_estimate(const CostEstimate& a, const CostEstimate& b) {
  return a.peak_bytes() == b.peak_bytes() && a.flops == b.flops && a.comm_bytes == b.comm_bytes && a.messages == b.messages &&
         a.bubble == b.bubble;
}

// A searched switch (a pass's boolean key) turned away from its default where this plan gives it
// nothing to do (fsdp's reduce_every_micro_batch in a step of one micro-batch) is put back to its
// default: the plan then reads as the candidate it duplicates. "Nothing to do" is what Strata can
// see: the estimate predicts the same memory and work, and the pass describes the same step in
// `strata plan`. Only switches: a choice among named alternatives (a pipeline schedule) names
// itself in the description, which for a pipeline builds the model.
void default_idle_switches(ResolvedStrategy& plan, const std::vector<size_t>& order, const CostEstimate& core, const CostEstimate& cost,
                           const std::vector<Axis>& axes) {
  for (const Axis& axis : axes) {
    if (axis.pass.empty()) continue;
    for (size_t i = 0; i < plan.passes.size(); ++i) {
      const PassEntry& entry = plan.passes[i];
      if (!entry.enabled || entry.pass->name() != axis.pass || !entry.config.has(axis.key)) continue;
      const KeySpec* spec = entry.pass->info().schema.find(axis.key);
      if (!spec || spec->type != ValueType::Bool || !spec->default_value || entry.config.entry(axis.key).value == *spec->default_value) continue;
      ResolvedStrategy at_default = plan;
      at_default.passes[i].config.set(axis.key, Config::Entry{*spec->default_value});
      if (same_estimate(cost, add_pass_estimates(at_default, order, core)) &&
          entry.pass->describe_plan(entry.config, plan_facts(plan)) ==
              entry.pass->describe_plan(at_default.passes[i].config, plan_facts(at_default)))
        plan = std::move(at_default);
    }
  }
}

// What a planned candidate trains, written so that equivalent choices read the same: the
// resolved strategy with micro_batch as the size it resolves to (0 and global_batch / data are
// one choice) and searched switches with nothing to do at their defaults.
std::string effective_strategy(const CheckedPlan& checked, const CostEstimate& core, const CostEstimate& cost, const std::vector<Axis>& axes) {
  ResolvedStrategy copy = checked.plan;
  const MeshSizes& mesh = copy.layout.mesh;
  copy.job.set("micro_batch", Config::Entry{copy.job.get_int("global_batch") / std::max<int64_t>(1, mesh.data) / mesh.micro_batches});
  default_idle_switches(copy, checked.order, core, cost, axes);
  copy.file = "strategy.toml";  // the same for every candidate
  return resolved_strategy_toml(copy);
}

// "data 2 (fsdp) x tensor 2 (tensor_parallel)": the sizes above one (as planned, or as tried
// when the plan failed) and the pass serving each.
void name_layout(TuneCandidate& c, const std::vector<int64_t>& tried) {
  const ParallelLayout& l = c.checked.plan.layout;
  for (size_t i = 0; i < std::size(kDims); ++i) {
    const int64_t planned[] = {l.mesh.data, l.mesh.tensor, l.mesh.pipeline, l.mesh.context, l.mesh.expert};
    const int64_t size = c.rejected.empty() ? planned[i] : tried[i];
    if (size <= 1) continue;
    std::string server;
    for (const auto& entry : c.checked.plan.passes)
      for (Dim d : entry.pass ? entry.pass->claims().dims : std::vector<Dim>{})
        if (entry.enabled && d == kDims[i]) server = entry.pass->name();
    c.layout += std::string(c.layout.empty() ? "" : " x ") + dim_name(kDims[i]) + " " + std::to_string(size) +
                (server.empty() ? "" : " (" + server + ")");
  }
  if (c.layout.empty()) c.layout = "one rank";
}

RawEntry tune_entry(Value value) { return RawEntry{std::move(value), SourcePos{"strata tune", 0, 0}, Origin::CommandLine}; }

// Every way to write n as an ordered product of one factor per free dimension.
void factorisations(int64_t n, size_t dim, std::vector<int64_t>& sizes, const std::vector<bool>& free,
                    std::vector<std::vector<int64_t>>& out) {
  if (dim == sizes.size()) {
    if (n == 1) out.push_back(sizes);
    return;
  }
  if (!free[dim]) return factorisations(n / sizes[dim], dim + 1, sizes, free, out);
  for (int64_t f = 1; f <= n; ++f)
    if (n % f == 0) {
      sizes[dim] = f;
      factorisations(n / f, dim + 1, sizes, free, out);
    }
  sizes[dim] = 1;
}

// The routed experts of the strategy's model per MoE layer: [model] n_experts as stated, else the
// model's default; 0 for a model without experts.
int64_t model_experts(const RawStrategy& base, const ComponentRegistry& registry) {
  if (const RawEntry* e = base.model.find("n_experts"); e && std::holds_alternative<int64_t>(e->value)) return std::get<int64_t>(e->value);
  const RawEntry* name = base.job.find("model");
  const KeySpec* job_model = job_schema().find("model");
  const Value model = name ? name->value : job_model && job_model->default_value ? *job_model->default_value : Value{std::string()};
  if (!std::holds_alternative<std::string>(model)) return 0;
  const Component* factory = registry.find(ComponentKind::Model, std::get<std::string>(model));
  const KeySpec* spec = factory ? factory->info().schema.find("n_experts") : nullptr;
  return spec && spec->default_value && std::holds_alternative<int64_t>(*spec->default_value) ? std::get<int64_t>(*spec->default_value) : 0;
}

// The meshes to try: every factorisation of `world_size` over the dimensions some pass claims,
// and for a model with experts every expert size that divides both data and its experts; a
// dimension the strategy sizes stays that size and one no pass can serve stays 1 (`free` says
// which dimensions tune sizes). With none, the strategy's own sizes: its plan says why they fail.
std::vector<std::vector<int64_t>> candidate_meshes(const RawStrategy& base, const std::map<Dim, std::vector<const Pass*>>& claimants,
                                                   int64_t world_size, int64_t experts, std::vector<bool>& free) {
  std::vector<int64_t> sizes(std::size(kDims), 1);
  free.assign(std::size(kDims), true);
  for (size_t i = 0; i < std::size(kDims); ++i) {
    const RawEntry* e = base.parallel.find(dim_name(kDims[i]));
    if (e && std::holds_alternative<int64_t>(e->value)) sizes[i] = std::get<int64_t>(e->value), free[i] = false;
    if (!claimants.count(kDims[i])) free[i] = false;
  }
  if (experts < 2) free[kExpert] = false;
  std::vector<std::vector<int64_t>> meshes;
  int64_t fixed_product = 1;
  for (size_t i = 0; i < kWorldDims; ++i)
    if (!free[i]) fixed_product *= sizes[i];
  if (fixed_product > 0 && world_size % fixed_product == 0) {
    std::vector<int64_t> start = sizes;
    std::vector<bool> world_free(free.begin(), free.begin() + kWorldDims);
    start.resize(kWorldDims);
    std::vector<std::vector<int64_t>> world_meshes;
    factorisations(world_size, 0, start, world_free, world_meshes);
    for (std::vector<int64_t>& mesh : world_meshes) {
      mesh.push_back(sizes[kExpert]);
      if (!free[kExpert]) {
        // Experts split over groups of data ranks: a data size the strategy's expert size does
        // not divide cannot plan.
        if (mesh[0] % sizes[kExpert] == 0) meshes.push_back(mesh);
        continue;
      }
      for (int64_t e = 1; e <= mesh[0]; ++e)
        if (mesh[0] % e == 0 && experts % e == 0) meshes.push_back(mesh), meshes.back()[kExpert] = e;
    }
  }
  if (meshes.empty()) meshes.push_back(sizes);
  return meshes;
}

// Keys to search: [job]'s and every enabled pass's (named by the strategy or `added` by tune)
// that declare tune values, where the strategy leaves them unset.
std::vector<Axis> searched_axes(const RawStrategy& base, const std::map<std::string, const RawSection*>& named,
                                const ComponentRegistry& registry, const std::vector<const Pass*>& added) {
  std::vector<Axis> axes;
  for (const auto& spec : job_schema().keys())
    if (!spec.tune_values.empty() && !base.job.find(spec.key)) axes.push_back({"", spec.key, spec.tune_values});
  auto add_pass_axes = [&](const Pass* p, const RawSection* section) {
    for (const auto& spec : p->info().schema.keys())
      if (!spec.tune_values.empty() && !(section && section->find(spec.key))) axes.push_back({p->name(), spec.key, spec.tune_values});
  };
  for (const auto& [name, section] : named)
    if (const Pass* p = registry.find_pass(name); p && section_enabled(*section)) add_pass_axes(p, section);
  for (const Pass* p : added) add_pass_axes(p, nullptr);
  return axes;
}

// The strategy with one combination written in: the mesh's free sizes, the passes tune adds, the
// `value`-th value of each axis; `choices` says what was chosen.
TuneCandidate make_candidate(const RawStrategy& base, const std::vector<int64_t>& mesh, const std::vector<bool>& free,
                             const std::vector<const Pass*>& added, const std::vector<Axis>& axes, const std::vector<size_t>& value) {
  TuneCandidate c;
  c.raw = base;
  for (size_t i = 0; i < std::size(kDims); ++i)
    if (free[i]) {
      c.raw.parallel.set(dim_name(kDims[i]), tune_entry(mesh[i]));
      if (mesh[i] > 1) c.choices.push_back(std::string("parallel.") + dim_name(kDims[i]) + " = " + std::to_string(mesh[i]));
    }
  for (const Pass* p : added) {
    RawSection section;
    section.label = "[[pass]] '" + p->name() + "' (strata tune)";
    section.pos = SourcePos{"strata tune", 0, 0};
    section.set("name", tune_entry(p->name()));
    c.raw.passes.push_back(std::move(section));
    c.choices.push_back("pass " + p->name());
  }
  for (size_t a = 0; a < axes.size(); ++a) {
    const Value& v = axes[a].values[value[a]];
    RawSection* target = &c.raw.job;
    if (!axes[a].pass.empty())
      for (auto& section : c.raw.passes)
        if (section_pass_name(section) == axes[a].pass) target = &section;
    target->set(axes[a].key, tune_entry(v));
    c.choices.push_back((axes[a].pass.empty() ? "job." : "pass." + axes[a].pass + ".") + axes[a].key + " = " + value_to_toml(v));
  }
  return c;
}

}  // namespace

// ATorch's finetune_strategy: the layout and passes stay; the values the strategy gives searched
// keys (KeySpec::tune_values) are removed, so the search tries every declared value of them.
bool open_to_finetune(RawStrategy& raw, const ComponentRegistry& registry, int64_t ranks, Diagnostics& diagnostics) {
  CheckedPlan checked;
  OperatorTable::global().install(registry);
  if (!check_plan(raw, registry, ranks, checked, diagnostics)) return false;
  const ParallelLayout& l = checked.plan.layout;
  const std::pair<const char*, int64_t> sizes[] = {
      {"data", l.mesh.data}, {"tensor", l.mesh.tensor}, {"pipeline", l.mesh.pipeline}, {"context", l.mesh.context}, {"expert", l.mesh.expert}};
  for (const auto& [dim, size] : sizes)
    if (std::string(dim) != "expert" || model_experts(raw, registry) > 1)
      raw.parallel.set(dim, RawEntry{Value{size}, SourcePos{"strata tune --finetune", 0, 0}, Origin::CommandLine});
  auto open = [](RawSection& section, const Schema& schema) {
    std::erase_if(section.entries, [&](const auto& entry) {
      const KeySpec* spec = schema.find(entry.first);
      return spec && !spec->tune_values.empty();
    });
  };
  open(raw.job, job_schema());
  for (auto& section : raw.passes) {
    const RawEntry* name = section.find("name");
    if (const Pass* pass = name && std::holds_alternative<std::string>(name->value) ? registry.find_pass(std::get<std::string>(name->value)) : nullptr)
      open(section, pass->info().schema);
  }
  return true;
}

std::string other_choices(const TuneCandidate& c) {
  std::string out;
  for (const auto& choice : c.choices) {
    const bool names_layout_pass = choice.rfind("pass ", 0) == 0 && c.layout.find("(" + choice.substr(5) + ")") != std::string::npos;
    if (choice.rfind("parallel.", 0) != 0 && !names_layout_pass) out += (out.empty() ? "" : "; ") + choice;
  }
  return out;
}

TuneSpace generate_candidates(const RawStrategy& base, const ComponentRegistry& registry, int64_t world_size,
                              const HardwareRates& rates, size_t limit) {
  OperatorTable::global().install(registry);
  // Passes by the dimension they claim, but those the strategy switched off (they stay off: a
  // dimension only they could serve stays 1); the passes the strategy names, enabled or not.
  std::map<Dim, std::vector<const Pass*>> claimants;
  std::vector<const Pass*> optional;
  std::map<std::string, const RawSection*> named;
  for (const auto& section : base.passes) named[section_pass_name(section)] = &section;
  for (const Component* c : registry.components(ComponentKind::Pass)) {
    const auto* pass = static_cast<const Pass*>(c);
    const bool switched_off = named.count(pass->name()) && !section_enabled(*named.at(pass->name()));
    if (!switched_off)
      for (Dim d : pass->claims().dims) claimants[d].push_back(pass);
    if (pass->claims().dims.empty() && pass->tune_use() == TuneUse::Try && !named.count(pass->name())) optional.push_back(pass);
  }
  std::vector<bool> free;  // the dimensions tune sizes
  const std::vector<std::vector<int64_t>> meshes = candidate_meshes(base, claimants, world_size, model_experts(base, registry), free);

  TuneSpace space;
  std::set<std::string> seen;  // effective strategies of the candidates that planned
  for (const auto& mesh : meshes) {
    // Which pass serves each dimension above one that no named pass serves yet.
    std::vector<std::vector<const Pass*>> dim_choices;
    for (size_t i = 0; i < std::size(kDims); ++i) {
      bool served = false;
      for (const Pass* p : claimants[kDims[i]])
        if (named.count(p->name()) && section_enabled(*named[p->name()])) served = true;
      if (mesh[i] > 1 && !served) dim_choices.push_back(claimants[kDims[i]]);
    }
    // Odometer over the dimension choices, then the optional passes on/off.
    std::vector<size_t> pick(dim_choices.size(), 0);
    for (bool more = true; more;) {
      for (uint64_t mask = 0; mask < (uint64_t{1} << optional.size()); ++mask) {
        std::vector<const Pass*> added;
        for (size_t k = 0; k < dim_choices.size(); ++k) added.push_back(dim_choices[k][pick[k]]);
        for (size_t k = 0; k < optional.size(); ++k)
          if (mask >> k & 1) added.push_back(optional[k]);
        const std::vector<Axis> axes = searched_axes(base, named, registry, added);
        std::vector<size_t> value(axes.size(), 0);
        for (bool more_values = true; more_values;) {
          if (++space.generated > limit) {
            space.truncated = true;
            break;
          }
          TuneCandidate c = make_candidate(base, mesh, free, added, axes, value);
          Diagnostics diagnostics;
          const bool planned = check_plan(c.raw, registry, world_size, c.checked, diagnostics);
          const CostEstimate core = planned ? core_estimate(c.checked.plan) : CostEstimate{};
          if (planned) c.cost = add_pass_estimates(c.checked.plan, c.checked.order, core);
          if (planned && !seen.insert(effective_strategy(c.checked, core, c.cost, axes)).second) {
            ++space.duplicates;
          } else if (planned) {
            c.predicted_s = predicted_step_seconds(c.cost, rates);
            c.predicted_bytes = predicted_peak_bytes(c.cost, rates);
          } else {
            c.rejected = diagnostics.items().front().message;
          }
          if (!c.rejected.empty() || c.predicted_bytes > 0) {
            name_layout(c, mesh);
            space.candidates.push_back(std::move(c));
          }
          // Next value combination.
          more_values = false;
          for (size_t a = 0; a < axes.size() && !more_values; ++a) {
            if (++value[a] < axes[a].values.size()) more_values = true;
            else value[a] = 0;
          }
        }
        if (space.truncated) break;
      }
      if (space.truncated) break;
      more = false;
      for (size_t k = 0; k < pick.size() && !more; ++k) {
        if (++pick[k] < dim_choices[k].size()) more = true;
        else pick[k] = 0;
      }
    }
    if (space.truncated) break;
  }
  std::stable_sort(space.candidates.begin(), space.candidates.end(), [](const TuneCandidate& a, const TuneCandidate& b) {
    if (a.rejected.empty() != b.rejected.empty()) return a.rejected.empty();
    if (!a.rejected.empty()) return false;
    return a.predicted_s != b.predicted_s ? a.predicted_s < b.predicted_s : a.predicted_bytes < b.predicted_bytes;
  });
  return space;
}

}  // namespace strata
