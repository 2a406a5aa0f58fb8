// strata ckpt: export a checkpoint's model to Hugging Face layout, consolidate it, describe it.
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <c10/util/accumulate.h>
#include <nlohmann/json.hpp>

#include "../engine/fault_injection.h"
#include "../strategy/components_from_files.h"
#include "checkpoint.h"
#include "parameter_stream.h"
#include "ir/initial_draws.h"
#include "tokenizer_export.h"
#include "strata/core/log.h"
#include "strata/core/run_directory.h"
#include "strata/core/trainer.h"
#include "strata/errors.h"
#include "strata/interchange.h"
#include "strata/model.h"
#include "strata/core/safetensors.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// A checkpoint directory sits in RUN/checkpoints/; a run directory holds strategy.toml.
bool is_checkpoint_dir(const fs::path& source) { return fs::exists(source / "manifest.json"); }

engine::Checkpoint open_source(const fs::path& source) {
  if (is_checkpoint_dir(source)) return engine::Checkpoint::open(source);
  if (!fs::is_directory(source)) throw UserError(source.string() + " is neither a run directory nor a checkpoint directory");
  auto checkpoint = engine::open_newest_valid_checkpoint(source / "checkpoints", [](const std::string& m) { log::warn(m); });
  if (!checkpoint) throw UserError("no valid checkpoint in " + (source / "checkpoints").string());
  return *checkpoint;
}

// A run directory holds only what runs write: a --resume refuses it with anything else inside
// (engine/run_directory.cpp), and a checkpoint directory is checksummed as a whole. So an export
// or a consolidated file written into either, at any depth, would block the run it came from:
// `dir` (where the output lands) is refused there.
void refuse_inside_run(const fs::path& dir, const std::string& what) {
  const fs::path path = fs::absolute(dir).lexically_normal();
  for (fs::path p = path;; p = p.parent_path()) {
    if (holds_a_run(p))
      throw UserError(what + " " + dir.string() + " is inside the run directory " + p.string() +
                      ", which holds only what runs write (a --resume refuses anything else there); write it elsewhere");
    if (is_checkpoint_dir(p)) throw UserError(what + " " + dir.string() + " is inside the checkpoint " + p.string() + "; write it elsewhere");
    if (p == p.parent_path()) break;
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

// transformers' file names: one model.safetensors, or model-00001-of-00003.safetensors ... with
// model.safetensors.index.json mapping each tensor to its file.
std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

bool is_weight_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == "model.safetensors" || name == "model.safetensors.index.json" || std::regex_match(name, shard);
}

// Splits the weights, in order, into files of at most `max_bytes` as transformers' save_pretrained
// does (a tensor larger than that gets a file of its own) and writes them into `dir`, one
// tensor's copy at a time, with `dtype` for the floating-point ones.
void write_hf_weights(const fs::path& dir, const NamedTensors& weights, at::ScalarType dtype, uint64_t max_bytes,
                      const TensorWriteHooks& hooks) {
  std::vector<NamedTensors> shards(1);
  std::vector<uint64_t> shard_bytes(1, 0);
  uint64_t total = 0;
  for (const auto& [name, tensor] : weights) {
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * c10::elementSize(safetensors_stored_dtype(tensor, dtype));
    if (!shards.back().empty() && shard_bytes.back() + bytes > max_bytes) shards.emplace_back(), shard_bytes.push_back(0);
    shards.back().emplace_back(name, tensor);
    shard_bytes.back() += bytes, total += bytes;
  }
  if (shards.size() == 1) {
    write_safetensors(dir / "model.safetensors", shards[0], {{"format", "pt"}}, {}, dtype, hooks);
    return;
  }
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_name(i, shards.size());
    write_safetensors(dir / file, shards[i], {{"format", "pt"}}, {}, dtype, hooks);
    engine::inject_fault(0, 0, "export");  // chaos: a re-export killed between two weight files
    for (const auto& [name, tensor] : shards[i]) map[name] = file;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  engine::write_text_durably(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

// An export is written whole into a hidden directory inside `out` (the same file system, so that
// moving a file in is a rename) and moved in only once every file is there: a re-export that fails
// or is killed part-way leaves the previous export as it was (a leftover staging directory is
// cleared by the next export; transformers ignores it). Moving in, the weight files of either form
// the new export does not write go first (transformers reads a model.safetensors left beside a
// new index first), then each new file replaces its old one by a rename. Other files are kept.
class StagedExport {
 public:
  explicit StagedExport(const fs::path& out) : out_(out), staging_(out / ".strata-export.tmp") {
    fs::create_directories(out_);
    fs::remove_all(staging_);
    fs::create_directories(staging_);
  }
  ~StagedExport() {
    std::error_code ignored;
    fs::remove_all(staging_, ignored);
  }
  StagedExport(const StagedExport&) = delete;
  StagedExport& operator=(const StagedExport&) = delete;

  const fs::path& dir() const { return staging_; }

  void publish() {
    std::set<std::string> staged;
    for (const auto& entry : fs::directory_iterator(staging_)) staged.insert(entry.path().filename().string());
    for (const auto& entry : fs::directory_iterator(out_)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && is_weight_file(name) && !staged.count(name)) fs::remove(entry.path());
    }
    for (const std::string& name : staged) fs::rename(staging_ / name, out_ / name);
    engine::fsync_directory(out_);  // every staged file was fsynced as it was written
  }

 private:
  fs::path out_, staging_;
};

}  // namespace

namespace {

// A checkpoint's model built without its values (every parameter allocated, no page touched),
// and one fill request per parameter, the parameter itself its target.
struct UnfilledModel {
  std::shared_ptr<nn::Model> model;
  ResolvedStrategy plan;
  Config config;
  engine::Checkpoint checkpoint;
  std::vector<engine::TensorRequest> parameters;
};

UnfilledModel build_unfilled_model(const fs::path& source, const ComponentRegistry& registry) {
  const fs::path run_dir = is_checkpoint_dir(source) ? source.parent_path().parent_path() : source;
  engine::Checkpoint checkpoint = open_source(source);
  Diagnostics diagnostics;
  RawStrategy raw = load_strategy_file(run_dir / "strategy.toml", diagnostics);
  // Resolved for the world size that saved the checkpoint, so fixed [parallel] sizes (data = 2,
  // tensor = 2) resolve as they did in training; only [model] and [data] are used here.
  ResolvedStrategy plan = resolve_strategy(raw, registry, checkpoint.meta().world_size, diagnostics);
  if (!diagnostics.ok()) throw UserError("cannot read the run's strategy: " + diagnostics.items().front().pos.str() + ": " +
                                         diagnostics.items().front().message);

  const auto* factory = static_cast<const ModelFactory*>(plan.model_component);
  Config config = without_init_from(plan.model);
  // Every parameter is filled from the checkpoint (fill refuses one it cannot fill whole).
  std::shared_ptr<nn::Model> model;
  {
    nn::SkipInitialDraws no_draws;
    model = factory->create(config);
  }
  std::vector<engine::TensorRequest> parameters;
  for (const auto& p : model->named_parameters()) parameters.push_back({"model/" + p.key(), p.value().detach(), std::nullopt});
  return {std::move(model), std::move(plan), std::move(config), std::move(checkpoint), std::move(parameters)};
}

}  // namespace

CheckpointModel load_checkpoint_model(const fs::path& source, const ComponentRegistry& registry) {
  UnfilledModel m = build_unfilled_model(source, registry);
  // Filled in place: the parameters themselves are the targets (no second copy of the model).
  m.checkpoint.fill(m.parameters, 0);
  for (const auto& q : m.parameters) engine::refuse_non_finite(m.checkpoint, q);
  return {std::move(m.model), std::move(m.plan), std::move(m.config), m.checkpoint.path()};
}

bool is_hf_directory(const fs::path& dir) {
  return fs::is_regular_file(dir / "config.json") && !fs::exists(dir / "strategy.toml") && !is_checkpoint_dir(dir);
}

CheckpointModel load_hf_model(const fs::path& dir, const ComponentRegistry& registry) {
  // A strategy of init_from alone: [job] model from config.json's model_type, every [model] key
  // from config.json (strategy/components_from_files.h, the models' DerivesDefaults); seq_len is
  // the context config.json states, so a learned position table is taken whole and the sampling
  // window is that context. The dataset only completes the strategy: nothing reads it.
  const fs::path config_file = dir / "config.json";
  std::ifstream in(config_file);
  const nlohmann::json hf = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!hf.is_object()) throw UserError(config_file.string() + " is not a JSON object (transformers' config.json)");
  const std::string type = hf.value("model_type", nlohmann::json()).is_string() ? hf["model_type"].get<std::string>() : "";
  if (type.empty()) throw UserError(config_file.string() + " names no model_type: not a transformers model directory");
  if (const size_t loaders = models_loading(type, registry).size(); loaders != 1)
    throw UserError(config_file.string() + " describes a " + type + " model, which " +
                    (loaders == 0 ? "no registered model loads" : "several registered models load") +
                    " (`strata plugins` lists the model types each loads)");
  RawStrategy raw;
  raw.file = config_file.string();
  const SourcePos at{raw.file, 0, 0};
  for (RawSection* section : {&raw.job, &raw.model, &raw.data, &raw.optimizer, &raw.parallel}) section->pos = at;
  raw.job.label = "[job]", raw.model.label = "[model]", raw.data.label = "[data]", raw.optimizer.label = "[optimizer]", raw.parallel.label = "[parallel]";
  raw.job.set("dataset", RawEntry{std::string("synthetic"), at, Origin::File});
  raw.data.set("vocab_size", RawEntry{int64_t{2}, at, Origin::File});
  raw.model.set("init_from", RawEntry{fs::absolute(dir).lexically_normal().string(), at, Origin::File});
  for (const char* context : {"n_positions", "max_position_embeddings"})
    if (hf.contains(context) && hf[context].is_number_integer()) raw.model.set("seq_len", RawEntry{hf[context].get<int64_t>(), at, Origin::File});
  Diagnostics diagnostics;
  ResolvedStrategy plan = resolve_strategy(raw, registry, 1, diagnostics);
  if (!diagnostics.ok()) throw UserError(dir.string() + ": " + diagnostics.items().front().message);
  const auto* factory = static_cast<const ModelFactory*>(plan.model_component);
  std::shared_ptr<nn::Model> model;
  {
    nn::SkipInitialDraws no_draws;  // init_from fills every parameter as the model is built
    model = factory->create(plan.model);
  }
  const Config config = without_init_from(plan.model);
  return {std::move(model), std::move(plan), config, dir};
}

fs::path export_hf(const fs::path& source, const fs::path& out, const ComponentRegistry& registry) {
  return export_hf(source, out, registry, ExportOptions{});
}

fs::path export_hf(const fs::path& source, const fs::path& out, const ComponentRegistry& registry, at::ScalarType dtype) {
  return export_hf(source, out, registry, ExportOptions{dtype});
}

fs::path export_hf(const fs::path& source, const fs::path& out, const ComponentRegistry& registry, const ExportOptions& options) {
  const at::ScalarType dtype = options.dtype;
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    throw UserError(std::string("export writes float32, bfloat16 or float16 weights, not ") + c10::toString(dtype));
  if (options.max_shard_bytes < 1) throw UserError("an export's largest weight file must hold at least 1 byte");
  refuse_inside_run(out, "the export directory");
  UnfilledModel loaded = build_unfilled_model(source, registry);
  const auto* factory = static_cast<const ModelFactory*>(loaded.plan.model_component);
  const Config& config = loaded.config;
  StagedExport staged(out);
  const fs::path& dir = staged.dir();
  // Views of the model's parameters (transposed where transformers' layout is), each filled from
  // the checkpoint, cast and laid out as it is written and its memory given back after: the
  // export holds one parameter and its copy at a time (parameter_stream.h). A model whose to_hf
  // computes tensors is filled whole first.
  NamedTensors hf = factory->to_hf(*loaded.model, config);
  engine::ParameterStream parameters(loaded.checkpoint, loaded.parameters, hf);
  if (!parameters.streams()) {
    parameters.fill_all();
    hf = factory->to_hf(*loaded.model, config);
  }
  write_hf_weights(dir, hf, dtype, options.max_shard_bytes, parameters.hooks());
  hf.clear();
  engine::write_text_durably(dir / "config.json", factory->hf_config_json(config));
  // The tokenizer where the run's data says which one it was: bytes for the text dataset, the
  // prepared directory's for token files `strata data prepare` wrote. Otherwise no tokenizer and
  // no special ids the run never had.
  const Config& data = loaded.plan.data;
  std::optional<int64_t> eos;
  if (data.has("document_end") && data.get_int("document_end") >= 0) eos = data.get_int("document_end");
  const std::string dataset = loaded.plan.dataset_component ? loaded.plan.dataset_component->name() : "";
  const int64_t context = model_context(config, config.get_int("seq_len"));
  if (dataset == "text") write_byte_level_tokenizer(dir, context, eos);
  if (dataset == "tokens" && data.has("path")) copy_prepared_tokenizer(dir, data.get_string("path"), context);
  complete_hf_config(dir / "config.json", eos, dtype);
  staged.publish();
  return loaded.checkpoint.path();
}

fs::path consolidate_checkpoint(const fs::path& source, const fs::path& out) {
  refuse_inside_run(out.has_parent_path() ? out.parent_path() : fs::path("."), "the consolidated file's directory");
  const engine::Checkpoint checkpoint = open_source(source);
  // Each tensor allocated (untouched), filled as it is written and its pages given back after: one
  // tensor in memory at a time, not the model and its optimizer state (parameter_stream.h).
  std::vector<engine::TensorRequest> requests;
  NamedTensors tensors;
  for (const auto& info : checkpoint.describe()) {
    requests.push_back({info.name, at::empty(info.shape, at::TensorOptions().dtype(info.dtype)), std::nullopt});
    tensors.emplace_back(info.name, requests.back().target);
  }
  engine::ParameterStream stream(checkpoint, std::move(requests), tensors, engine::ParameterStream::NonFinite::kept);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  write_safetensors(out, tensors,
                    {{"format", "strata-consolidated-1"},
                     {"step", std::to_string(checkpoint.meta().step)},
                     {"state_hash", checkpoint.meta().state_hash},
                     {"saved_by_ranks", std::to_string(checkpoint.meta().world_size)}},
                    {}, at::ScalarType::Undefined, stream.hooks());
  return checkpoint.path();
}

std::string describe_checkpoint(const fs::path& source) {
  const engine::Checkpoint checkpoint = open_source(source);
  const auto infos = checkpoint.describe();
  std::uintmax_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(checkpoint.path()))
    if (entry.is_regular_file()) bytes += entry.file_size();
  std::ostringstream text;
  text << "checkpoint " << checkpoint.path().string() << "\n"
       << "  step " << checkpoint.meta().step << ", saved by " << checkpoint.meta().world_size << " rank(s), "
       << infos.size() << " tensors, " << bytes << " bytes on disk, state hash " << checkpoint.meta().state_hash.substr(0, 16)
       << "\n";
  std::map<std::string, std::pair<int, int64_t>> per_state;  // tensors, elements
  for (const auto& info : infos) {
    auto& entry = per_state[info.name.substr(0, info.name.find('/'))];
    entry.first += 1;
    entry.second += c10::multiply_integers(info.shape);
  }
  for (const auto& [key, entry] : per_state)
    text << "  " << key << ": " << entry.first << " tensors, " << entry.second << " elements\n";
  for (const auto& info : infos) {
    const int64_t whole = c10::multiply_integers(info.shape);
    text << "  " << info.name << "  " << c10::toString(info.dtype) << " " << engine::shape_text(info.shape) << "  ";
    if (info.pieces_in.empty())
      text << "whole on rank(s) " << ranks_text(info.whole_in);
    else
      text << "sliced over rank(s) " << ranks_text(info.pieces_in) << " (" << info.stored_elements << " of " << whole
           << " elements stored)";
    text << "\n";
  }
  return text.str();
}

}  // namespace strata
