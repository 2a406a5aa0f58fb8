// Strategy files: parsing TOML with source positions, command-line overrides, and resolution
// against the schemas of core and of the components the strategy names.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "strata/config.h"
#include "strata/core/component_registry.h"

namespace strata {

// A value as written, before it is checked against any schema.
struct RawEntry {
  Value value;
  SourcePos pos;
  Origin origin = Origin::File;
};

struct STRATA_API RawSection {
  std::string label;  // "[job]", "[[pass]] #2", used in messages
  SourcePos pos;      // the header, or the file when the section is absent
  std::vector<std::pair<std::string, RawEntry>> entries;  // in file order

  const RawEntry* find(const std::string& key) const;
  void set(const std::string& key, RawEntry entry);
};

struct RawStrategy {
  std::string file;  // as given, used in messages
  RawSection job, model, data, optimizer, parallel;
  std::vector<RawSection> passes;  // [[pass]] tables, in file order
};

// The sections a strategy may have, in the order plans and docs show them.
STRATA_API const std::vector<std::string>& strategy_sections();

// Syntax errors are reported with the position toml++ gives; an unreadable file is a UserError.
STRATA_API RawStrategy parse_strategy_text(const std::string& text, const std::string& file, Diagnostics& diagnostics);
STRATA_API RawStrategy load_strategy_file(const std::filesystem::path& file, Diagnostics& diagnostics);

// `--set section.key=value` (or pass.NAME.key=value) and `--disable NAME`. Values are read as
// TOML (10, 0.5, true, ["a"]); anything that is not TOML is taken as a bare string.
STRATA_API void apply_overrides(RawStrategy& strategy, const StringList& sets, const StringList& disables,
                                Diagnostics& diagnostics);

// The strategy as TOML with only the keys it holds (what a user wrote, plus overrides), after
// `header` (comment lines). plugin_path entries become absolute, so the file works from anywhere.
STRATA_API std::string raw_strategy_toml(const RawStrategy& strategy, const std::string& header);

// plugin_path entries from [job], relative to the strategy file's directory.
STRATA_API std::vector<std::filesystem::path> strategy_plugin_path(const RawStrategy& strategy);

struct PassEntry {
  const Pass* pass = nullptr;
  bool enabled = true;
  Config config;  // the pass's own keys; `name` and `enabled` are not repeated here
  SourcePos pos;
};

// The mesh a strategy resolved to. Its sizes are the plugin ABI's MeshSizes, the one type for them
// in core and plugins (expert divides data); `mesh.micro_batches` is the micro-batches each
// data-parallel rank runs per optimizer step, set by resolve_strategy from [job].
struct ParallelLayout {
  int64_t world_size = 1;
  MeshSizes mesh;
  StringList order;  // innermost first
};

struct ResolvedStrategy {
  std::string file;
  Config job, model, data, optimizer, parallel;
  const Component* model_component = nullptr;
  const Component* dataset_component = nullptr;
  const Component* optimizer_component = nullptr;
  ParallelLayout layout;
  std::vector<PassEntry> passes;  // in file order, disabled ones included
  SourcePos data_pos;             // [data], for messages about the data
};

// Checks every section against its schema and fills in defaults. All problems are reported.
STRATA_API ResolvedStrategy resolve_strategy(const RawStrategy& raw, const ComponentRegistry& registry,
                                             int64_t world_size, Diagnostics& diagnostics);

// `model` ([model]) with init_from cleared, for a model whose every weight a checkpoint then gives
// (a resumed run, an export): the pretrained weights would be read for nothing, and may be gone.
STRATA_API Config without_init_from(const Config& model);

// The context a model is made for: [model] max_positions where the model declares it and it is
// set, else `seq_len`. An export states it (config.json, the tokenizer's model_max_length) and
// `strata sample` reads windows that long, as transformers' generate does on the export.
STRATA_API int64_t model_context(const Config& model, int64_t seq_len);

// Every size a rank checks before training, so that a plan that passes trains: the global batch
// over the data-parallel ranks and micro-batches, the model's split over tensor ranks, each
// enabled pass's size_problem and plan_problem. Arithmetic on the plan only: nothing is opened.
STRATA_API void check_sizes(const ResolvedStrategy& plan, Diagnostics& diagnostics);
// The data against the model: its vocabulary, one window of seq_len + 1 tokens in each split
// (engine/data_check.cpp). This opens the dataset, relative to the working directory as training
// does. Data that cannot be opened here (planning away from it) is not an error of the plan: the
// reason is returned, and `strata plan` says the data was not checked. Exporting a checkpoint
// does not call it.
STRATA_API std::string check_data(const ResolvedStrategy& plan, Diagnostics& diagnostics);
// What passes may read of the plan (describe_plan, plan_problem): sections, model factory, mesh,
// device and the dtype the blocks compute in. Needs the plan's model component.
STRATA_API PlanFacts plan_facts(const ResolvedStrategy& plan);
// The samples in one micro-batch of a data-parallel rank ([job] micro_batch, or its whole share
// of the global batch when that is 0).
STRATA_API int64_t micro_batch_size(const ResolvedStrategy& plan);

// A strategy after every plan-time check (resolve, pass order, claims, sizes), or the errors.
struct CheckedPlan {
  ResolvedStrategy plan;
  std::vector<size_t> order;
  std::string data_not_checked;  // why the data could not be opened, if it could not
  // Keys stated for a feature the strategy states off, which nothing reads (unread_keys.h): a
  // line each, for `strata plan` and `strata run` to print as notes.
  std::vector<std::string> unread_notes;
};
// What `strata plan`, `strata run`, `strata tune`'s candidates and the library API run on a parsed
// strategy (strategy/plan_check.cpp). Returns false with the problems in `diagnostics`.
STRATA_API bool check_plan(const RawStrategy& raw, const ComponentRegistry& registry, int64_t world_size, CheckedPlan& out,
                           Diagnostics& diagnostics);


// Core's own sections. [optimizer] is this plus the chosen optimizer's keys.
STRATA_API const Schema& job_schema();
STRATA_API const Schema& parallel_schema();
STRATA_API const Schema& optimizer_common_schema();
STRATA_API const Schema& pass_common_schema();

}  // namespace strata
