// The training loop: builds the job from the plan, applies passes, and runs the step program.
#include "strata/core/trainer.h"

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include <sys/resource.h>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include "../sha256.h"
#include "checkpoint.h"
#include "metrics.h"
#include "op_profile.h"
#include "sampler.h"
#include "schedule.h"
#include "strata/core/local_communicator.h"
#include "strata/core/launch_env.h"
#include "strata/core/log.h"
#include "strata/core/operator_table.h"
#include "strata/core/flash_checkpoint.h"
#include "strata/core/flight_recorder.h"
#include "strata/core/progress.h"
#include "strata/core/step_plan.h"
#include "strata/data.h"
#include "strata/errors.h"
#include "strata/job.h"
#include "strata/ops.h"
#include "strata/core/run_directory.h"

namespace strata {

namespace {

// Chaos testing (tests/cli/chaos_test.sh, flash_chaos_test.sh): STRATA_FAULT holds faults
// separated by ';', each "KIND RANK STEP", applied in the first attempt of a supervised run only
// (STRATA_RESTART_COUNT 0) so that the restarted ranks run clean, or in every attempt with
// STRATA_FAULT_EVERY_ATTEMPT set (to test giving up). At `point`:
//   "step"     (as step STEP starts; STEP 0: at start-up) kill: SIGKILL, stop: SIGSTOP;
//   "backward" (as the backward of step STEP's first micro-batch starts) stop_in_backward: SIGSTOP;
//   "snapshot" (halfway through the flash copy of step STEP) kill_in_snapshot: SIGKILL;
//   "snapshot_done" (after the flash snapshot of step STEP) corrupt_snapshot: returns true, and
//              the caller flips a byte of that snapshot.
bool inject_fault(int rank, int64_t step, const std::string& point = "step", const std::function<void()>& before_kill = {}) {
  const char* fault = std::getenv("STRATA_FAULT");
  const char* attempt = std::getenv("STRATA_RESTART_COUNT");
  if (!fault || (attempt && std::string(attempt) != "0" && !std::getenv("STRATA_FAULT_EVERY_ATTEMPT"))) return false;
  std::istringstream faults(fault);
  for (std::string one; std::getline(faults, one, ';');) {
    std::istringstream in(one);
    std::string kind;
    int fault_rank = -1;
    int64_t fault_step = -1;
    if (!(in >> kind >> fault_rank >> fault_step) || fault_rank != rank || fault_step != step) continue;
    if (point == "step" && kind == "kill") {
      if (before_kill) before_kill();
      std::raise(SIGKILL);
    }
    if (point == "step" && kind == "stop") std::raise(SIGSTOP);
    if (point == "backward" && kind == "stop_in_backward") std::raise(SIGSTOP);
    if (point == "snapshot" && kind == "kill_in_snapshot") std::raise(SIGKILL);
    if (point == "snapshot_done" && kind == "corrupt_snapshot") return true;
  }
  return false;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

namespace fs = std::filesystem;
using engine::BatchSampler;

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

struct SavedState {
  NamedTensors tensors;
  Placements placements;
};

// What this rank writes (as the tensors are, on their device: a flash snapshot copies them
// straight into shared memory, a disk save through for_disk). A tensor (or piece) that every
// data rank holds alike is written by one of them, so replicas write no byte twice; they are
// shared out by bytes (largest first, each to the data rank with the fewest bytes so far, the
// same on every rank), since a snapshot or save waits for the rank with the most. Pieces sharded
// over the data ranks and per-rank state (the RNG) are written by their own rank, pieces of split
// experts by one rank of those holding them.
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
  SavedState out;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (writer[i] != dp_rank) continue;
    out.tensors.emplace_back(entries[i].name, entries[i].tensor);
    if (entries[i].placement) out.placements.emplace(entries[i].name, *entries[i].placement);
  }
  return out;
}

// The tensors on the CPU, each with a storage of its own (pieces of one flat buffer share one;
// a safetensors file needs each apart).
NamedTensors for_disk(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor cpu = tensor.to(at::kCPU);
    if (cpu.storage().nbytes() != cpu.nbytes()) cpu = cpu.clone(at::MemoryFormat::Contiguous);
    out.emplace_back(name, cpu);
  }
  return out;
}

// Every state asks the checkpoint for exactly the tensors (and pieces) it saves itself, so a
// checkpoint saved by any number of ranks under any layout loads here. A checkpoint that passed
// its checksums but cannot be read (a damaged shard under a manifest rewritten to match it)
// loads nothing on any rank: the ranks agree before loading, and `problem` says what failed.
bool restore_state(const Job& job, const engine::Checkpoint& checkpoint, int rank, std::string& problem) {
  std::vector<engine::TensorRequest> requests;
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
    checkpoint.fill(requests, rank);
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

std::vector<ParamGroup> parameter_groups(const nn::Model& model, const Config& optimizer) {
  const double decay = optimizer.get_float("weight_decay");
  const bool decay_all = optimizer.get_bool("decay_norms_and_biases");
  std::vector<std::string> decayed = model.decayed_parameter_names();
  ParamGroup with_decay{{}, {}, decay}, without_decay{{}, {}, 0.0};
  for (const auto& p : model.named_parameters()) {
    bool decays = decay_all || std::find(decayed.begin(), decayed.end(), p.key()) != decayed.end();
    ParamGroup& group = decays ? with_decay : without_decay;
    group.names.push_back(p.key());
    group.params.push_back(p.value());
  }
  return {with_decay, without_decay};
}

// Bytes held in model states, each storage counted once (views of one flat buffer, parameters
// freed between uses), and the process's peak resident memory.
struct MemoryFigures {
  double params = 0, grads = 0, optimizer = 0, peak = 0;
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
  return m;
}

// "cuda" without an index means this rank's device: the local rank's, round robin over the
// node's devices, so that the ranks of a node do not all use cuda:0.
c10::Device parse_device(const std::string& text, int local_rank) {
  try {
    c10::Device device(text);
    if (device.is_cuda() && !at::hasCUDA()) throw UserError("[job] device = \"" + text + "\" but no CUDA device is available");
    if (device.is_cuda() && !device.has_index())
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % std::max<int>(1, at::getNumGPUs())));
    return device;
  } catch (const c10::Error&) {
    throw UserError("[job] device \"" + text + "\" is not a device name (cpu, cuda, cuda:N)");
  }
}

// Identifies what shapes the saved state and the sequence of batches: a resume with another
// model, data or optimizer is refused. Ranks, parallel layout, passes, steps, logging and paths
// may change; state a pass keeps is checked when it loads.
std::string state_hash(const ResolvedStrategy& plan) {
  std::string text;
  auto add = [&](const std::string& section, const Config& config) {
    for (const auto& [key, entry] : config.entries()) text += section + "." + key + "=" + value_to_toml(entry.value) + "\n";
  };
  Config job;
  for (const char* key : {"model", "dataset", "global_batch", "seed", "shuffle"}) job.set(key, plan.job.entry(key));
  add("job", job);
  add("model", plan.model);
  add("data", plan.data);
  add("optimizer", plan.optimizer);
  Sha256 hash;
  hash.update(text.data(), text.size());
  return hash.hex_digest();
}

// The topology of [parallel] over this process's rank, with its communicators: the configured
// backend's when there are several ranks, a local one otherwise.
std::shared_ptr<Topology> make_topology(const ResolvedStrategy& plan, const ComponentRegistry& registry, const LaunchEnv& env,
                                        ProgressBeacon& progress) {
  const ParallelLayout& l = plan.layout;
  if (l.world_size != env.world_size)
    throw UserError("the plan is for " + std::to_string(l.world_size) + " ranks but " + std::to_string(env.world_size) +
                    " were started (" + env.launcher + ")");
  std::vector<Dim> order;
  for (const auto& name : l.order)
    order.push_back(name == "tensor" ? Dim::Tensor : name == "context" ? Dim::Context : name == "pipeline" ? Dim::Pipeline : Dim::Data);
  auto topology = std::make_shared<Topology>(
      std::map<Dim, int>{{Dim::Data, static_cast<int>(l.data)}, {Dim::Tensor, static_cast<int>(l.tensor)},
                         {Dim::Pipeline, static_cast<int>(l.pipeline)}, {Dim::Context, static_cast<int>(l.context)},
                         {Dim::Expert, static_cast<int>(l.expert)}},
      order, env.rank);
  const std::string& name = plan.parallel.get_string("backend");
  auto backend_named = [&](const std::string& n) {
    const auto* b = static_cast<const CommunicatorBackend*>(registry.find(ComponentKind::Communicator, n));
    if (!b) throw UserError("[parallel] backend \"" + n + "\" is not a registered communicator (see `strata plugins`)");
    return b;
  };
  // One host rank needs no MPI; several are bootstrapped by the mpi backend.
  std::shared_ptr<Communicator> bootstrap = local_communicator();
  if (env.world_size > 1) {
    if (env.launcher == "torchrun")
      throw UserError("started by torchrun, but the mpi bootstrap needs mpirun or srun; use strata run -n N or mpirun");
    bootstrap = backend_named("mpi")->world(*bootstrap);
  }
  // A host-tensor job on one rank keeps the local communicator; device backends always start.
  auto world = name == "mpi" ? bootstrap : backend_named(name)->world(*bootstrap);
  // Under a supervisor every operation goes to the flight recorder (strata/core/flight_recorder.h).
  topology->attach(record_collectives(std::move(world), progress));
  const std::vector<std::pair<Dim, const char*>> dims{{Dim::Data, "data"}, {Dim::Tensor, "tensor"}, {Dim::Pipeline, "pipeline"}, {Dim::Context, "context"}};
  for (unsigned mask = 1; mask < 16; ++mask) {  // name every group by the dimensions it spans
    std::vector<Dim> spanned;
    std::string label;
    bool every_dim_split = true;  // else the group is the same as a smaller mask's
    for (unsigned d = 0; d < dims.size(); ++d) {
      if (!(mask & (1u << d))) continue;
      spanned.push_back(dims[d].first);
      label += label.empty() ? dims[d].second : std::string("+") + dims[d].second;
      every_dim_split = every_dim_split && topology->size(dims[d].first) > 1;
    }
    if (every_dim_split && topology->size(spanned) < topology->world_size()) label_group(topology->group(spanned), label);
  }
  return topology;
}

}  // namespace

RunSummary run_training(const ResolvedStrategy& plan, const std::vector<size_t>& order, const ComponentRegistry& registry,
                        const RunOptions& options) {
  const Config& job_cfg = plan.job;
  const LaunchEnv env = detect_launch_env();
  const fs::path out_dir = options.out_dir.empty() ? fs::path(job_cfg.get_string("run_dir")) : options.out_dir;
  const fs::path checkpoints_dir = out_dir / "checkpoints";
  const bool leader = env.rank == 0;

  // Where this rank is, for the supervisor's hang detection (strata/core/progress.h); from here,
  // so that a rank stuck starting up is named too.
  inject_fault(env.rank, 0);
  ProgressBeacon progress(env.rank);
  progress.beat(0, StepPhase::StartingUp);
  auto topology = make_topology(plan, registry, env, progress);
  // The run directory is claimed (locked, and refused if it holds another run) by the launcher
  // that started the ranks, or else here by rank 0 before any rank writes into it.
  std::optional<RunDirectoryClaim> claim;
  if (leader && !std::getenv(kRunDirectoryClaimedEnv)) claim.emplace(out_dir, options.resume, options.overwrite);
  topology->world().barrier()->wait();
  // Resuming: the newest checkpoint that passes its checksums, and older ones to fall back on.
  // A resume with another configuration is refused before anything is written.
  std::vector<std::string> skipped;  // why newer checkpoints were passed over
  std::optional<engine::Checkpoint> newest;
  std::vector<fs::path> older;
  if (options.resume) {
    older = engine::checkpoint_dirs_newest_first(checkpoints_dir);
    while (!newest && !older.empty()) {
      newest = engine::open_checkpoint_or_explain(older.front(), skipped);
      older.erase(older.begin());
    }
    if (newest && newest->meta().state_hash != state_hash(plan))
      throw UserError("checkpoint " + newest->path().string() +
                      " was saved with another model, data or optimizer configuration; resume with the strategy.toml "
                      "saved in " + out_dir.string());
  }
  fs::create_directories(out_dir / "logs");
  log::add_file((out_dir / "logs" / ("rank_" + std::to_string(env.rank) + ".log")).string());
  if (leader) engine::write_text_durably(out_dir / "strategy.toml", resolved_strategy_toml(plan));
  const int64_t threads = job_cfg.get_int("threads");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(threads > 0 ? threads : std::max(1u, cores / static_cast<unsigned>(env.local_size))));
  const c10::Device device = parse_device(job_cfg.get_string("device"), env.slot);
  // Denormal floats make CPU arithmetic many times slower (seen: PyTorch eager's backward 3.7x
  // slower by the fourth step of a GPT); flushing them to zero changes results only below 1e-38.
  at::globalContext().setFlushDenormal(true);
  const int64_t seed = job_cfg.get_int("seed");
  at::manual_seed(static_cast<uint64_t>(seed));
  OperatorTable::global().install(registry);

  Job job(plan.job, plan.model, plan.data, plan.optimizer, device);
  job.topology = topology;
  // The micro-batch in flight, for the supervisor's hang report (pipelines run them out of order).
  job.add_hook(HookPoint::BeforeForward, [&progress](StepContext& c) { progress.beat_micro(c.micro, false); });
  job.add_hook(HookPoint::BeforeBackward, [&progress, rank = env.rank](StepContext& c) {
    progress.beat_micro(c.micro, true);
    if (c.micro == 0) inject_fault(rank, c.step, "backward");
  });
  // Built at this rank's local shapes: split layers hold only its tensor-parallel piece.
  try {
    job.model = static_cast<const ModelFactory*>(plan.model_component)
                    ->create_shard(plan.model, nn::TensorShard{topology->size(Dim::Tensor), topology->rank_in(Dim::Tensor)});
  } catch (const c10::Error& e) {
    // A model too large for this machine fails in the allocator; say so instead of an internal error.
    const std::string what = e.what_without_backtrace();
    if (what.find("allocate") == std::string::npos && what.find("memory") == std::string::npos) throw;
    throw UserError("[model] does not fit in this rank's memory (" + what.substr(0, what.find('\n')) + ")");
  }
  job.model->to(device);
  auto dataset = static_cast<const DatasetFactory*>(plan.dataset_component)->open(plan.data, DataContext{fs::current_path()});
  if (dataset->vocab_size() > job.model->vocab_size())
    throw UserError("[data] has a vocabulary of " + std::to_string(dataset->vocab_size()) + " tokens but [model] vocab_size is " +
                    std::to_string(job.model->vocab_size()));
  const auto* optimizer_factory = static_cast<const OptimizerFactory*>(plan.optimizer_component);
  job.make_optimizer = [&](std::vector<ParamGroup> groups) { return optimizer_factory->create(std::move(groups), plan.optimizer); };

  // Core's step program. Passes own or wrap stages below (their Claims say which); the loop at
  // the end runs the stages in order, so this block and the plan's "Step program" are the step.
  const int64_t global_batch = job_cfg.get_int("global_batch");
  const int64_t dp = topology->size(Dim::Data), dp_rank = topology->rank_in(Dim::Data);
  // resolve_strategy checked that the batch splits (check_sizes in strategy_resolve.cpp).
  const int64_t local_batch = global_batch / dp;
  const int64_t micro_batch = job_cfg.get_int("micro_batch") > 0 ? job_cfg.get_int("micro_batch") : local_batch;
  const int64_t micro_count = local_batch / micro_batch;
  const int64_t steps = job_cfg.get_int("steps"), seq_len = job.model->seq_len();
  BatchSampler sampler(*dataset, seq_len, static_cast<uint64_t>(seed), job_cfg.get_bool("shuffle"));
  std::unique_ptr<Optimizer> optimizer;  // built once passes are applied

  job.loss = [vocab = job.model->vocab_size()](const at::Tensor& logits, const at::Tensor& targets) {
    return ops::cross_entropy(logits.reshape({-1, vocab}), targets.reshape(-1));
  };
  job.reduce_loss = [&job](double local_loss) {
    // Scalars go through the communicator on the job's device (nccl takes device tensors only).
    // Context ranks hold equal shares of each sequence's tokens: the mean of their means is the
    // mean over all tokens.
    at::Tensor mean = at::tensor(local_loss, at::kDouble).to(job.device());
    job.topology->group({Dim::Data, Dim::Context}).all_reduce(mean, ReduceOp::Avg)->wait();
    return mean.item<double>();
  };
  // Packed documents: the bundled datasets declare [data] document_end and reset_positions.
  const Config& data_cfg = job.data_config();
  const int64_t document_end = data_cfg.has("document_end") ? data_cfg.get_int("document_end") : -1;
  const bool reset_positions = data_cfg.has("reset_positions") && data_cfg.get_bool("reset_positions");
  if (reset_positions && document_end < 0)
    throw UserError("[data] reset_positions = true needs document_end (the token that ends each document)");
  job.split_batch = [seq_len, document_end, reset_positions](const at::Tensor& batch) {
    MicroBatch micro{batch.narrow(1, 0, seq_len), batch.narrow(1, 1, seq_len), {}};
    micro.sequence = nn::packed_sequence(micro.inputs, document_end, reset_positions);
    return micro;
  };
  // The loss of one batch of [B, seq_len + 1] tokens: what training and evaluation both run.
  auto batch_loss = [&job](const at::Tensor& batch) {
    const MicroBatch micro = job.split_batch(batch);
    const nn::SequenceScope sequence(micro.sequence);
    return job.loss(job.model->forward(micro.inputs), micro.targets);
  };
  // Every parameter's gradient, placed as its parameter (as passes left it: expert parallel
  // splits experts after this point); stages hold disjoint parameters.
  job.local_gradients = [&job] {
    const Placements placements = nn::parameter_placements(*job.model);
    std::vector<LocalGradient> grads;
    for (const auto& p : job.model->named_parameters()) {
      const auto placement = placements.find(p.key());
      grads.push_back({p.value().grad(), nest(placement == placements.end() ? Placement{} : placement->second, 0, {Dim::Pipeline})});
    }
    return grads;
  };

  job.validation_batch = [&sampler, micro_batch, device](int64_t index) {
    return sampler.val_batch(index * micro_batch, micro_batch).to(device);
  };

  StepProgram& program = job.program;
  // Every data-parallel rank reads the same global batch and trains on its own slice of it, so
  // the samples of a step do not depend on the world size.
  program.provide(Stage::PrepareBatches, core_stage_description(Stage::PrepareBatches),
                  [&, dp, dp_rank, micro_batch, micro_count](StepContext& context) {
                    context.batches.clear();
                    for (int64_t micro = 0; micro < micro_count; ++micro)
                      context.batches.push_back(
                          sampler.next_train(micro_batch * dp).narrow(0, dp_rank * micro_batch, micro_batch).to(device));
                  });
  program.provide(Stage::Gradients, core_stage_description(Stage::Gradients), [&program](StepContext& context) {
    program.run(Stage::ForwardBackward, context);
    program.run(Stage::SyncGradients, context);
  });
  program.provide(Stage::ForwardBackward, core_stage_description(Stage::ForwardBackward),
                  [&job, batch_loss](StepContext& context) {
                    double loss_sum = 0;
                    const int64_t count = static_cast<int64_t>(context.batches.size());
                    for (int64_t micro = 0; micro < count; ++micro) {
                      context.micro = micro;
                      job.run_hooks(HookPoint::BeforeForward, context);
                      context.loss = batch_loss(context.batches[static_cast<size_t>(micro)]);
                      job.run_hooks(HookPoint::AfterForward, context);
                      context.last_backward = micro + 1 == count;
                      job.run_hooks(HookPoint::BeforeBackward, context);
                      const double weight = context.loss_scale / static_cast<double>(count);
                      const nn::LossGradientScale auxiliary_losses(weight);
                      (context.loss * weight).backward();
                      job.run_hooks(HookPoint::AfterBackward, context);
                      context.last_backward = false;
                      loss_sum += context.loss.item<double>();
                    }
                    context.local_loss = loss_sum / static_cast<double>(count);
                  });
  program.provide(Stage::SyncGradients, core_stage_description(Stage::SyncGradients), [](StepContext&) {});
  program.provide(Stage::ClipGradients, core_stage_description(Stage::ClipGradients),
                  [&job, max_norm = plan.optimizer.get_float("grad_clip")](StepContext& context) {
                    // Every piece counted once over the mesh, whatever its placement.
                    context.grad_norm = clip_gradient_norm(job.local_gradients(), max_norm, job.topology.get(), job.device());
                  });
  program.provide(Stage::OptimizerStep, core_stage_description(Stage::OptimizerStep), [&optimizer](StepContext& context) {
    if (!context.skip_step) optimizer->step(context.lr);
  });
  program.provide(Stage::Evaluate, core_stage_description(Stage::Evaluate),
                  [&job, batch_loss](StepContext& context) {
                    double total = 0;
                    const int64_t batches = job.job_config().get_int("eval_batches");
                    for (int64_t b = 0; b < batches; ++b) total += batch_loss(job.validation_batch(b)).item<double>();
                    context.val_loss = total / static_cast<double>(batches);
                  });

  job.register_state("model", std::make_shared<ModelState>(job.model));
  OperatorTable::global().bind(job);  // stateful operator implementations reach the job's groups
  for (size_t i : order) {
    const Pass& pass = *plan.passes[i].pass;
    program.begin_pass(pass.name(), pass.claims());
    pass.apply(job, plan.passes[i].config);
    program.end_pass();
  }
  log::record("step program:\n" + describe_step_program(program));  // the rank log keeps what ran

  optimizer = job.make_optimizer(parameter_groups(*job.model, plan.optimizer));
  job.register_state("optimizer", std::make_shared<OptimizerState>(*optimizer, *job.model));
  job.register_state("data", std::make_shared<DataState>(sampler));
  job.register_state("rng", std::make_shared<RngState>());

  const engine::LrSchedule schedule{plan.optimizer.get_float("lr"), plan.optimizer.get_string("schedule"),
                                    plan.optimizer.get_int("warmup_steps"), steps, plan.optimizer.get_float("min_lr_ratio")};

  engine::Console console(steps, job_cfg.get_int("log_every"), job.model->training_flops_per_token(),
                          job_cfg.get_float("peak_tflops"), /*to_stdout=*/leader);
  int64_t start_step = 0;
  // Flash checkpoints: under a supervisor that persists them (STRATA_FLASH_DIR), the ranks
  // snapshot into shared memory and never write to disk themselves.
  const int64_t flash_every = job_cfg.get_int("flash_every");
  const char* flash_dir = std::getenv("STRATA_FLASH_DIR");
  std::optional<FlashWriter> flash;
  if (flash_every > 0 && flash_dir) flash.emplace(flash_dir, env.rank);
  else if (flash_every > 0) console.message("note: [job] flash_every needs `strata run -n N` (its supervisor writes the snapshots to disk); "
                                            "checkpointing to disk at checkpoint_every instead");
  if (options.resume) {
    const auto restore_started = std::chrono::steady_clock::now();
    // The newest flash snapshot, when it is at least as new as the newest disk checkpoint and
    // every image of it passes its checksum (each rank checks its share of the images).
    if (flash) {
      std::string problem;
      const auto sets = complete_flash_sets(flash_dir);
      const int64_t disk_step = newest ? newest->meta().step : 0;
      const FlashSet* set = !sets.empty() && sets.front().info.step >= disk_step && sets.front().info.state_hash == state_hash(plan)
                                ? &sets.front() : nullptr;
      at::Tensor agreed = at::tensor(std::vector<int64_t>{set ? set->info.step : -1, set ? -set->info.step : 1}, at::kLong).to(device);
      topology->world().all_reduce(agreed, ReduceOp::Max)->wait();
      agreed = agreed.cpu();
      if (set && agreed[0].item<int64_t>() == -agreed[1].item<int64_t>()) {
        // Each rank checks every world_size-th image; the flags say which failed.
        at::Tensor bad = at::zeros({static_cast<int64_t>(set->slots.size()) + 1}, at::kInt);  // last: cannot map
        for (size_t r = static_cast<size_t>(env.rank); r < set->slots.size(); r += static_cast<size_t>(env.world_size))
          if (flash_slot_problem(set->slots[r])) bad[static_cast<int64_t>(r)] = 1;
        std::optional<MappedFlashSet> mapped;
        try {
          mapped = map_flash_set(*set);
        } catch (const UserError& e) {
          bad[static_cast<int64_t>(set->slots.size())] = 1;
          problem = e.what();
        }
        bad = bad.to(device);
        topology->world().all_reduce(bad, ReduceOp::Max)->wait();
        const at::Tensor bad_ranks = bad.cpu().nonzero();
        if (bad_ranks.numel() > 0 && bad_ranks[0][0].item<int64_t>() == static_cast<int64_t>(set->slots.size()))
          problem = problem.empty() ? "another rank cannot map it" : problem;
        else if (bad_ranks.numel() > 0)
          problem = "the snapshot of rank " + std::to_string(bad_ranks[0][0].item<int64_t>()) + " at step " +
                    std::to_string(set->info.step) + " fails its checksum";
        if (bad_ranks.numel() == 0) {
          const engine::Checkpoint memory = engine::Checkpoint::from_images(
              {set->info.step, set->info.state_hash, set->info.world_size}, "the flash snapshot of step " + std::to_string(set->info.step),
              mapped->images, mapped->mappings);
          if (restore_state(job, memory, env.rank, problem)) {
            start_step = set->info.step;
            progress.set_restore(seconds_since(restore_started), RestoreSource::Memory);
            console.message("resumed from the flash snapshot of step " + std::to_string(start_step) + " in shared memory (" +
                            std::to_string(set->info.world_size) + " ranks saved it)");
            newest.reset(), older.clear(), skipped.clear();
          }
        }
        if (start_step == 0)
          console.message("skipping the flash snapshot of step " + std::to_string(set->info.step) + ": " + problem + "; loading from disk");
      }
    }
    // The newest checkpoint every rank can read; an older one stands in for a damaged newer one.
    const bool any = newest.has_value();
    while (newest) {
      std::string problem;
      if (newest->meta().state_hash != state_hash(plan))
        problem = "saved with another model, data or optimizer configuration";
      else if (restore_state(job, *newest, env.rank, problem)) {
        start_step = newest->meta().step;
        break;
      }
      skipped.push_back("checkpoint " + newest->path().string() + ": " + problem);
      newest.reset();
      while (!newest && !older.empty()) {
        newest = engine::open_checkpoint_or_explain(older.front(), skipped);
        older.erase(older.begin());
      }
    }
    for (const auto& reason : skipped) console.message("skipping " + reason);
    if (any && !newest) throw UserError("no checkpoint in " + checkpoints_dir.string() + " could be restored (see the lines above)");
    if (newest) progress.set_restore(seconds_since(restore_started), RestoreSource::Disk);
    if (start_step > 0 && !newest) {
      // resumed from memory above
    } else if (newest)
      console.message("resumed from " + newest->path().string() + " at step " + std::to_string(start_step) +
                      (newest->meta().world_size != env.world_size
                           ? " (saved by " + std::to_string(newest->meta().world_size) + " ranks)"
                           : std::string()));
    else
      console.message("no valid checkpoint in " + checkpoints_dir.string() + "; starting from step 0");
  }
  // Snapshots of steps after the one resumed from belong to the attempt being redone.
  if (flash) flash->discard_after(start_step);
  std::optional<engine::MetricsFile> metrics;
  if (leader) metrics.emplace(out_dir / "metrics.jsonl", start_step);
  const int64_t checkpoint_every = job_cfg.get_int("checkpoint_every"), eval_every = job_cfg.get_int("eval_every");
  // A checkpoint of `step`: a flash snapshot when the supervisor persists them (falling back to
  // disk for the rest of the run when any rank's shared memory cannot hold it), else a disk save.
  // Returns the seconds training was blocked.
  bool snapshot_skipped = false;  // by some rank, at the last save
  auto save = [&](int64_t step, bool to_disk) {
    const auto started = std::chrono::steady_clock::now();
    snapshot_skipped = false;
    const SavedState state = gather_state(job);
    if (flash) {
      std::string problem;
      // Skipped (the supervisor is persisting this rank's older slot) is not a failure: the
      // newest snapshot stays, and the next one goes ahead.
      const FlashWrite outcome = flash->write({step, plan.layout.world_size, state_hash(plan)}, state.tensors,
                                        engine::checkpoint_file_metadata(step, state.placements), problem,
                                        [&] { inject_fault(env.rank, step, "snapshot"); });
      at::Tensor outcomes =  // ranks that failed, ranks that skipped
          at::tensor(std::vector<int>{outcome == FlashWrite::Failed ? 1 : 0, outcome == FlashWrite::Skipped ? 1 : 0}, at::kInt).to(device);
      topology->world().all_reduce(outcomes, ReduceOp::Sum)->wait();
      outcomes = outcomes.cpu();
      if (outcomes[0].item<int>() == 0) {
        if (outcome == FlashWrite::Written && inject_fault(env.rank, step, "snapshot_done")) flash->damage_newest();
        snapshot_skipped = outcomes[1].item<int>() > 0;
        return seconds_since(started);
      }
      console.message("flash checkpoints off: " + (problem.empty() ? std::string("another rank's shared memory is full") : problem) +
                      "; checkpointing to disk");
      flash.reset();
      to_disk = true;
    }
    if (to_disk)
      engine::save_checkpoint(checkpoints_dir, {step, state_hash(plan), plan.layout.world_size}, for_disk(state.tensors),
                              state.placements, job_cfg.get_int("keep_checkpoints"), topology->world(), device);
    return seconds_since(started);
  };
  auto evaluate = [&](int64_t step) {
    at::NoGradGuard no_grad;
    job.model->eval();
    StepContext context;
    context.step = step;
    job.run_hooks(HookPoint::BeforeEvaluate, context);
    program.run(Stage::Evaluate, context);
    job.run_hooks(HookPoint::AfterEvaluate, context);
    job.model->train();
    return context.val_loss;
  };

  std::vector<at::Tensor> params;
  for (const auto& p : job.model->parameters()) params.push_back(p);
  RunSummary summary{start_step + 1, start_step, 0.0};
  job.model->train();
  // [job] profile_steps: the steps after two warm-up steps (allocator and caches settled).
  const int64_t profile_first = start_step + 3, profile_last = start_step + 2 + job_cfg.get_int("profile_steps");
  engine::OpProfile profile;
  for (int64_t step = start_step + 1; step <= steps; ++step) {
    if (step == profile_first && profile_last >= profile_first) profile.start();
    progress.beat(step, StepPhase::Starting);
    // A kill between steps finds the previous snapshot whole: its checksum thread may not have run
    // yet on a loaded machine, and a kill during a snapshot is kill_in_snapshot's case.
    inject_fault(env.rank, step, "step", [&] {
      if (flash) flash->wait();
    });
    const auto started = std::chrono::steady_clock::now();
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    StepContext context;
    context.step = step;
    context.micro_count = micro_count;
    program.run(Stage::PrepareBatches, context);
    progress.beat(step, StepPhase::BatchesReady);
    program.run(Stage::Gradients, context);
    progress.beat(step, StepPhase::GradientsDone);
    program.run(Stage::ClipGradients, context);
    progress.beat(step, StepPhase::Clipped);
    context.lr = schedule.at(step);
    job.run_hooks(HookPoint::BeforeStep, context);
    const MemoryFigures memory = memory_figures(job);
    program.run(Stage::OptimizerStep, context);
    job.run_hooks(HookPoint::AfterStep, context);
    job.model->collect_metrics(context.metrics);
    progress.beat(step, StepPhase::Updated);

    // The largest figure of any rank: what the busiest one needs.
    at::Tensor memory_max =
        at::tensor(std::vector<double>{memory.params, memory.grads, memory.optimizer, memory.peak}, at::kDouble).to(device);
    engine::StepRecord record;
    record.loss = job.reduce_loss(context.local_loss);
    topology->world().all_reduce(memory_max, ReduceOp::Max)->wait();
    record.step = step;
    record.grad_norm = context.grad_norm;
    record.lr = context.lr;
    record.tokens = global_batch * seq_len;
    record.extra = context.metrics;
    const char* memory_names[] = {"mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mem_peak_bytes"};
    memory_max = memory_max.cpu();
    for (int i = 0; i < 4; ++i) record.extra.emplace_back(memory_names[i], memory_max[i].item<double>());
    record.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    if (step >= profile_first && step <= profile_last) {
      profile.add_step(record.step_ms);
      if (step == profile_last || step == steps) {
        profile.stop();
        const fs::path file = out_dir / ("profile_rank" + std::to_string(env.rank) + ".md");
        profile.write(file, "Operator profile of rank " + std::to_string(env.rank) + ", steps " + std::to_string(profile_first) + ".." +
                                std::to_string(step));
        if (leader) console.message("operator profile of steps " + std::to_string(profile_first) + ".." + std::to_string(step) +
                                    " written to " + file.string());
      }
    }
    if (eval_every > 0 && (step % eval_every == 0 || step == steps)) {
      progress.beat(step, StepPhase::Evaluating);
      record.val_loss = evaluate(step);
    }
    // Checkpoint before the step is recorded, so its record says what the checkpoint blocked.
    const bool disk_due = (checkpoint_every > 0 && step % checkpoint_every == 0) || step == steps;
    if (disk_due || (flash && step % flash_every == 0)) {
      progress.beat(step, StepPhase::Checkpointing);
      const double blocked = save(step, disk_due);
      progress.add_checkpoint_time(blocked);
      // A snapshot some rank skipped (its older slot was being persisted) is told apart: it cost
      // the agreement only, and the newest complete snapshot is an older one.
      record.extra.emplace_back(snapshot_skipped ? "snapshot_skipped_ms" : "checkpoint_ms", blocked * 1000.0);
    }
    if (metrics) metrics->write(record);
    console.step(record);
    summary.last_step = step;
    summary.last_loss = record.loss;
  }
  if (flash) flash->wait();  // the last snapshot is valid before the supervisor persists it
  progress.beat(steps, StepPhase::Finished);
  console.finish();
  return summary;
}

}  // namespace strata
