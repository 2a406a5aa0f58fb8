// Core's checkpointed state and one rank's share of it (training_state.h).
#include "training_state.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <sys/resource.h>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/CPUGeneratorImpl.h>

#include "checkpoint/sha256.h"
#include "strata/core/counting_cpu_allocator.h"
#include "strata/errors.h"

namespace strata::engine {

namespace {

// Stateful adaptors for the pieces core owns.
class ModelState final : public Stateful {
 public:
  explicit ModelState(std::shared_ptr<nn::Model> model) : model_(std::move(model)) {}
  NamedTensors save() const override {
    NamedTensors out;
    for (const auto& p : model_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  void load(const NamedTensors& tensors) override { copy_into(save(), tensors, "model"); }
  // As the passes left the parameters (tensor-parallel pieces, split experts).
  Placements placements() const override { return nn::parameter_placements(*model_); }
  bool same_on_data_ranks() const override { return true; }

  // Copies `from` into the same-named tensors of `into`, which must match exactly.
  static void copy_into(const NamedTensors& into, const NamedTensors& from, const std::string& what) {
    if (into.size() != from.size())
      throw UserError("checkpoint " + what + " state has " + std::to_string(from.size()) + " tensors, the job has " +
                      std::to_string(into.size()));
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < into.size(); ++i) {
      const auto& [name, target] = into[i];
      auto it = std::find_if(from.begin(), from.end(), [&](const auto& f) { return f.first == name; });
      if (it == from.end()) throw UserError("checkpoint has no " + what + " tensor '" + name + "'");
      if (it->second.sizes() != target.sizes() || it->second.scalar_type() != target.scalar_type())
        throw UserError("checkpoint " + what + " tensor '" + name + "' has another shape or dtype than the job's");
      target.copy_(it->second);
    }
  }

 private:
  std::shared_ptr<nn::Model> model_;
};

// The model's buffers: state that is not trained by gradients but follows the training (a
// router's load-balancing bias, a plain module's running statistics). The same on every data
// rank for the bundled models (they reduce what moves them over the data ranks), so one writes.
class BufferState final : public Stateful {
 public:
  explicit BufferState(std::shared_ptr<nn::Model> model) : model_(std::move(model)) {}
  NamedTensors save() const override {
    NamedTensors out;
    for (const auto& b : model_->named_buffers()) out.emplace_back(b.key(), b.value());
    return out;
  }
  void load(const NamedTensors& tensors) override { ModelState::copy_into(save(), tensors, "buffers"); }
  bool same_on_data_ranks() const override { return true; }

 private:
  std::shared_ptr<nn::Model> model_;
};

class OptimizerState final : public Stateful {
 public:
  OptimizerState(Optimizer& optimizer, const nn::Model& model) : optimizer_(optimizer), model_(model) {}
  NamedTensors save() const override { return optimizer_.state_tensors(); }
  void load(const NamedTensors& tensors) override { ModelState::copy_into(optimizer_.state_tensors(), tensors, "optimizer"); }
  // An optimizer that places its own state (a sharding pass's) says so; a plain one's state
  // follows the parameters, tensor-parallel pieces included.
  Placements placements() const override {
    Placements own = optimizer_.state_placements();
    if (!own.empty()) return own;
    std::map<std::string, at::Tensor> params;
    for (const auto& p : model_.named_parameters()) params.emplace(p.key(), p.value());
    return state_placements_by_parameter(optimizer_.state_tensors(), params, nn::parameter_placements(model_));
  }
  // A data-sharded optimizer's whole tensors (step counters) exist only on ranks that hold a
  // piece of their parameter, so then nothing is known to be the same on every data rank.
  bool same_on_data_ranks() const override {
    for (const auto& [name, placement] : optimizer_.state_placements())
      if (placement.is_sharded_over(Dim::Data)) return false;
    return true;
  }

 private:
  Optimizer& optimizer_;
  const nn::Model& model_;
};

class DataState final : public Stateful {
 public:
  explicit DataState(BatchSampler& sampler) : sampler_(sampler) {}
  NamedTensors save() const override {
    return {{"position", at::tensor(std::vector<int64_t>{sampler_.epoch(), sampler_.cursor()}, at::kLong)}};
  }
  void load(const NamedTensors& tensors) override {
    at::Tensor position = at::zeros({2}, at::kLong);
    ModelState::copy_into({{"position", position}}, tensors, "data");
    sampler_.set_position(position[0].item<int64_t>(), position[1].item<int64_t>());
  }
  bool same_on_data_ranks() const override { return true; }

 private:
  BatchSampler& sampler_;
};

// The default CPU generator drives initialisation and dropout.
class RngState final : public Stateful {
 public:
  NamedTensors save() const override { return {{"cpu", at::detail::getDefaultCPUGenerator().get_state()}}; }
  void load(const NamedTensors& tensors) override {
    at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
    ModelState::copy_into({{"cpu", state}}, tensors, "rng");
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(state);
  }
};

double storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  double bytes = 0;
  for (const auto& t : tensors)
    if (t.defined() && t.has_storage() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<double>(t.storage().nbytes());
  return bytes;
}

std::vector<at::Tensor> tensors_of(const Stateful& state) {
  std::vector<at::Tensor> out;
  for (auto& [name, tensor] : state.save()) out.push_back(tensor);
  return out;
}

}  // namespace

std::shared_ptr<Stateful> model_state(std::shared_ptr<nn::Model> model) { return std::make_shared<ModelState>(std::move(model)); }
std::shared_ptr<Stateful> buffer_state(std::shared_ptr<nn::Model> model) { return std::make_shared<BufferState>(std::move(model)); }
std::shared_ptr<Stateful> optimizer_state(Optimizer& optimizer, const nn::Model& model) {
  return std::make_shared<OptimizerState>(optimizer, model);
}
std::shared_ptr<Stateful> data_state(BatchSampler& sampler) { return std::make_shared<DataState>(sampler); }
std::shared_ptr<Stateful> rng_state() { return std::make_shared<RngState>(); }

SavedState gather_state(const Job& job) {
  struct Entry {
    std::string name;
    at::Tensor tensor;
    std::optional<Placement> placement;
    bool replicated;
  };
  std::vector<Entry> entries;
  for (const auto& [key, state] : job.states()) {
    const Placements placements = state->placements();
    for (auto& [name, tensor] : state->save()) {
      const auto placement = placements.find(name);
      const bool data_sharded = placement != placements.end() &&
                                (placement->second.is_sharded_over(Dim::Data) || placement->second.is_sharded_over(Dim::Expert));
      entries.push_back({key + "/" + name, tensor.detach(),
                         placement != placements.end() ? std::optional<Placement>(placement->second) : std::nullopt,
                         state->same_on_data_ranks() && !data_sharded});
    }
  }
  const int dp = job.topology->size(Dim::Data), dp_rank = job.topology->rank_in(Dim::Data);
  std::vector<size_t> by_size;
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].replicated) by_size.push_back(i);
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return entries[a].tensor.nbytes() > entries[b].tensor.nbytes(); });
  std::vector<int> writer(entries.size(), dp_rank);
  std::vector<uint64_t> bytes(static_cast<size_t>(dp), 0);
  for (size_t i : by_size) {
    const auto least = std::min_element(bytes.begin(), bytes.end()) - bytes.begin();
    writer[i] = static_cast<int>(least);
    bytes[static_cast<size_t>(least)] += entries[i].tensor.nbytes();
  }
  // A piece of split experts is held alike by the data ranks with its expert coordinate (data
  // index c = replica x expert + coordinate): the first replica writes it.
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].placement && entries[i].placement->is_sharded_over(Dim::Expert) && !entries[i].placement->is_sharded_over(Dim::Data))
      writer[i] = dp_rank % job.topology->size(Dim::Expert);
  // A piece sharded within groups of S data ranks (HSDP) is held alike by every group: the first
  // group writes it.
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].placement && entries[i].placement->is_sharded_over(Dim::Data) && entries[i].placement->data_shard_size > 0)
      writer[i] = dp_rank % static_cast<int>(entries[i].placement->data_shard_size);
  SavedState out;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (writer[i] != dp_rank) continue;
    out.tensors.emplace_back(entries[i].name, entries[i].tensor);
    if (entries[i].placement) out.placements.emplace(entries[i].name, *entries[i].placement);
  }
  return out;
}

NamedTensors for_disk(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor cpu = tensor.to(at::kCPU);
    if (cpu.storage().nbytes() != cpu.nbytes()) cpu = cpu.clone(at::MemoryFormat::Contiguous);
    out.emplace_back(name, cpu);
  }
  return out;
}

bool restore_state(const Job& job, const Checkpoint& checkpoint, int rank, std::string& problem,
                   const std::function<void()>& heartbeat) {
  std::vector<TensorRequest> requests;
  std::vector<std::pair<size_t, size_t>> ranges;  // per state: its requests
  for (const auto& [key, state] : job.states()) {
    const Placements placements = state->placements();
    const size_t first = requests.size();
    for (const auto& [name, tensor] : state->save()) {
      auto placement = placements.find(name);
      requests.push_back({key + "/" + name, at::empty(tensor.sizes(), tensor.options().device(at::kCPU)),
                          placement == placements.end() ? std::nullopt : std::optional<Placement>(placement->second)});
    }
    ranges.emplace_back(first, requests.size());
  }
  int failed = 0;
  try {
    checkpoint.fill(requests, rank, heartbeat);
  } catch (const UserError& e) {
    problem = e.what();
    failed = 1;
  }
  at::Tensor any_failed = at::tensor(failed, at::kInt).to(job.device());
  job.topology->world().all_reduce(any_failed, ReduceOp::Max)->wait();
  if (any_failed.item<int>() != 0) {
    if (problem.empty()) problem = "another rank could not read it";
    return false;
  }
  size_t index = 0;
  for (const auto& [key, state] : job.states()) {
    NamedTensors mine;
    const auto [first, last] = ranges[index++];
    for (size_t i = first; i < last; ++i) mine.emplace_back(requests[i].name.substr(key.size() + 1), requests[i].target);
    state->load(mine);
  }
  return true;
}

MemoryFigures memory_figures(const Job& job) {
  std::vector<at::Tensor> params = tensors_of(*job.states().at("model"));
  for (const auto& p : job.model->parameters()) params.push_back(p);
  MemoryFigures m;
  m.params = storage_bytes(params);
  std::vector<at::Tensor> grads;
  for (const auto& g : job.local_gradients()) grads.push_back(g.grad);
  m.grads = storage_bytes(grads);
  m.optimizer = storage_bytes(tensors_of(*job.states().at("optimizer")));
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  m.peak = static_cast<double>(usage.ru_maxrss) * 1024.0;
  // Read from the allocator's host-side counters: no wait on the device.
  const c10::Device device = job.device();
  if (device.is_cpu())
    m.device_peak = static_cast<double>(CountingCpuAllocator::install().peak());
  else
    m.device_peak = static_cast<double>(
        at::accelerator::getDeviceStats(device.index()).allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
  return m;
}

namespace {

// strategy.toml as Strata writes it: "[section]" lines, then "key = value" lines; "section.key" ->
// value. Empty when the file is missing.
std::map<std::string, std::string> read_saved_strategy(const std::filesystem::path& file) {
  std::map<std::string, std::string> saved;
  std::ifstream in(file);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos || line.empty() || line.front() == '#') continue;
    saved[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return saved;
}

// A path names where a file is, not what it holds: data moved, or the weights a run started from
// deleted, leave its checkpoints resumable.
bool is_path_key(const std::string& section, const std::string& key) {
  return (section == "data" && key == "path") || (section == "model" && key == "init_from");
}

const KeySpec* spec_of(const ResolvedStrategy& plan, const std::string& section, const std::string& key) {
  if (section == "job") return job_schema().find(key);
  if (section == "model") return plan.model_component->info().schema.find(key);
  if (section == "data") return plan.dataset_component->info().schema.find(key);
  if (const KeySpec* common = optimizer_common_schema().find(key)) return common;
  return plan.optimizer_component->info().schema.find(key);
}

bool at_default(const ResolvedStrategy& plan, const std::string& section, const std::string& key, const Value& value) {
  const KeySpec* spec = spec_of(plan, section, key);
  return spec && spec->default_value && *spec->default_value == value;
}

// [optimizer] keys of the learning-rate schedule and clipping: they shape no state (the rate is a
// function of the step), so a resume may change them, as Megatron's
// --override-opt_param-scheduler does; hashed until 2026-12-01.
bool is_schedule_key(const std::string& section, const std::string& key) {
  static const std::set<std::string> keys{"lr", "schedule", "warmup_steps", "min_lr_ratio", "decay_fraction", "decay_shape", "grad_clip", "weight_decay"};
  return section == "optimizer" && keys.count(key) > 0;
}

struct IdentityEntry {
  std::string section, key, value;  // value: as TOML
  bool at_default;
};

// What a checkpoint's state depends on, one entry per key: [model], [data], [optimizer] and five
// keys of [job], without the paths and the keys at their defaults (a key a later Strata adds, at
// its default, changes no hash). `every_key`: all of them, the identity Strata hashed until
// 2026-11-30, less the keys at their defaults that `known` (a saved strategy's keys) lacks: keys
// added since. `relative_paths`: the paths as the working directory names them (the plan holds
// them absolute since 2026-11-30; a strategy that named them relative hashed them so before).
// `schedule`: with the schedule keys (is_schedule_key), as Strata hashed until 2026-12-01 (and
// always with every_key).
std::vector<IdentityEntry> state_identity(const ResolvedStrategy& plan, bool every_key, const std::map<std::string, std::string>* known = nullptr,
                                          bool relative_paths = false, bool schedule = true) {
  std::vector<IdentityEntry> entries;
  auto add = [&](const std::string& section, const Config& config) {
    for (const auto& [key, entry] : config.entries()) {
      if (!schedule && !every_key && is_schedule_key(section, key)) continue;
      const bool by_default = at_default(plan, section, key, entry.value), path = is_path_key(section, key);
      Value value = entry.value;
      if (const auto* name = std::get_if<std::string>(&value); path && relative_paths && name && !name->empty())
        value = std::filesystem::proximate(*name).string();
      const bool added_since = known && by_default && !known->count(section + "." + key);
      if (every_key ? !added_since : (!path && !by_default)) entries.push_back({section, key, value_to_toml(value), by_default});
    }
  };
  Config job;
  for (const char* key : {"model", "dataset", "global_batch", "seed", "shuffle"}) job.set(key, plan.job.entry(key));
  add("job", job);
  add("model", plan.model);
  add("data", plan.data);
  add("optimizer", plan.optimizer);
  return entries;
}

std::string identity_hash(const std::vector<IdentityEntry>& identity) {
  std::string text;
  for (const auto& e : identity) text += e.section + "." + e.key + "=" + e.value + "\n";
  Sha256 hash;
  hash.update(text.data(), text.size());
  return hash.hex_digest();
}

}  // namespace

std::string state_hash(const ResolvedStrategy& plan) {
  return identity_hash(state_identity(plan, false, nullptr, false, /*schedule=*/false));
}

std::set<std::string> accepted_state_hashes(const ResolvedStrategy& plan, const std::filesystem::path& saved_strategy) {
  const std::map<std::string, std::string> known = read_saved_strategy(saved_strategy);
  return {state_hash(plan), identity_hash(state_identity(plan, false)), identity_hash(state_identity(plan, true, &known)),
          identity_hash(state_identity(plan, true, &known, true))};
}

std::vector<std::string> schedule_changes(const ResolvedStrategy& plan, const std::filesystem::path& saved_strategy) {
  const std::map<std::string, std::string> saved = read_saved_strategy(saved_strategy);
  std::vector<std::string> changes;
  if (saved.empty()) return changes;
  for (const auto& [key, entry] : plan.optimizer.entries()) {
    if (!is_schedule_key("optimizer", key)) continue;
    const std::string value = value_to_toml(entry.value);
    if (const auto it = saved.find("optimizer." + key); it != saved.end() && it->second != value)
      changes.push_back("optimizer." + key + " = " + value + " (" + it->second + " before)");
  }
  return changes;
}

std::vector<std::string> state_differences(const ResolvedStrategy& plan, const std::filesystem::path& saved_strategy) {
  const std::map<std::string, std::string> saved = read_saved_strategy(saved_strategy);
  std::vector<std::string> differences;
  if (saved.empty()) return differences;
  for (const auto& e : state_identity(plan, true)) {
    if (is_path_key(e.section, e.key) || is_schedule_key(e.section, e.key)) continue;
    const std::string key = e.section + "." + e.key;
    const auto it = saved.find(key);
    if (it == saved.end()) {
      // A key the saving Strata did not have ran at its default there.
      if (!e.at_default) differences.push_back(key + " (not set there, " + e.value + " here)");
    } else if (it->second != e.value) {
      differences.push_back(key + " = " + it->second + " there, " + e.value + " here");
    }
  }
  return differences;
}

}  // namespace strata::engine
