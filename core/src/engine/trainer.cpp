// The Trainer (strata/core/trainer.h): set-up, one step, the run and its checkpoints. What one
// step runs is core's step program (core_stages.cpp) as the passes left it; `strata plan` prints it.
#include "strata/core/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "core_stages.h"
#include "fault_injection.h"
#include "model_build.h"
#include "topology_setup.h"
#include "trainer_impl.h"
#include "training_state.h"
#include "strata/core/counting_cpu_allocator.h"
#include "strata/core/host_memory.h"
#include "strata/core/cpu_features.h"
#include "strata/core/device_peak.h"
#include "strata/core/log.h"
#include "strata/core/process_memory.h"
#include "strata/core/operator_table.h"
#include "strata/core/step_plan.h"
#include "strata/errors.h"
#include "strata/core/statistics.h"

namespace strata {

namespace fs = std::filesystem;
using engine::inject_fault;

namespace {

// The loss a program gave (RunOptions::loss), told apart from one a pass put in its place.
struct ProgramLoss {
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;
  at::Tensor operator()(const at::Tensor& logits, const at::Tensor& targets) const { return loss(logits, targets); }
};

// The model's figures that are still on the device (nn::ReportsDeviceMetrics): read with the
// step's loss, only when the step is recorded.
engine::StageFigures::Figures model_device_figures(const nn::Model& model) {
  engine::StageFigures::Figures figures;
  for (const auto& module : model.modules(/*include_self=*/false))
    if (auto* reporter = dynamic_cast<nn::ReportsDeviceMetrics*>(module.get())) reporter->report_device_metrics(figures);
  return figures;
}

}  // namespace

namespace {
std::atomic<bool> trainer_alive{false};
}  // namespace

ProcessTrainerSlot::ProcessTrainerSlot(const ComponentRegistry& registry) {
  if (trainer_alive.exchange(true))
    throw UserError("another Trainer is alive in this process; destroy it before building the next (the operator table is "
                    "process-wide)");
  try {
    OperatorTable::global().install(registry);
  } catch (...) {
    OperatorTable::global().reset();
    trainer_alive = false;
    throw;
  }
}

ProcessTrainerSlot::~ProcessTrainerSlot() {
  OperatorTable::global().reset();
  trainer_alive = false;
}

Trainer::Impl::Impl(const ResolvedStrategy& plan_in, std::vector<size_t> order_in, const ComponentRegistry& registry_in,
                    RunOptions options_in)
    : plan(plan_in),
      order(std::move(order_in)),
      registry(registry_in),
      process_slot(registry_in),
      options(std::move(options_in)),
      env(detect_launch_env()),
      out_dir(options.out_dir.empty() ? fs::path(plan.job.get_string("run_dir")) : options.out_dir),
      checkpoints_dir(out_dir / "checkpoints"),
      leader(env.rank == 0) {
  // A worker group torchrun restarted continues the run, whatever the first attempt was told.
  if (restarted_by_torchelastic(env)) options.resume = true, options.overwrite = false;
  inject_fault(env.rank, 0);
  start_rank();
  claim_run_directory();
  configure_process();
  build_job();
  compose_step();
  prepare_loop();
}

// Where this rank is, its device, and the mesh's communicators.
void Trainer::Impl::start_rank() {
  // Where this rank is, for the supervisor's hang detection (strata/core/progress.h); from here,
  // so that a rank stuck starting up is named too.
  progress.emplace(env.rank);
  progress->beat(0, StepPhase::StartingUp);
  // The job's device is current before any communicator starts: a device backend (nccl) binds
  // its communicators to the current device.
  device = engine::parse_device(plan.job.get_string("device"), env.slot);
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
  topology = engine::make_topology(plan, registry, env, *progress);
}

// The run directory claimed (or refused), a resume of another configuration refused before
// anything is written, the rank's log and the resolved strategy written.
void Trainer::Impl::claim_run_directory() {
  // The run directory is claimed (locked, and refused if it holds another run) by the launcher
  // that started the ranks, or else here by rank 0 before any rank writes into it.
  if (leader && !std::getenv(kRunDirectoryClaimedEnv)) claim.emplace(out_dir, options.resume, options.overwrite);
  topology->world().barrier()->wait();
  // A resume with another configuration is refused before anything is written.
  accepted_hashes = engine::accepted_state_hashes(plan, out_dir / "strategy.toml");
  if (options.resume) {
    find_checkpoints();
    if (newest && !accepted_hashes.count(newest->meta().state_hash)) {
      // Name what changed, from the strategy the run directory's last run wrote.
      std::vector<std::string> changed = engine::state_differences(plan, out_dir / "strategy.toml");
      // A checkpoint saved before 2026-12-01 hashed the schedule's keys too.
      if (changed.empty()) changed = engine::schedule_changes(plan, out_dir / "strategy.toml");
      std::string what;
      for (size_t i = 0; i < std::min<size_t>(changed.size(), 4); ++i) what += (i ? "; " : ": ") + changed[i];
      if (changed.size() > 4) what += "; and " + std::to_string(changed.size() - 4) + " more";
      throw UserError("checkpoint " + newest->path().string() + " was saved with another model, data or optimizer configuration" +
                      what + "; resume with the strategy.toml saved in " + out_dir.string());
    }
    // A changed learning-rate schedule is the user's to make, and said once.
    if (newest && leader)
      for (const std::string& change : engine::schedule_changes(plan, out_dir / "strategy.toml"))
        std::cerr << "strata: note: resuming with " << change << "\n";
  }
  fs::create_directories(out_dir / "logs");
  log::add_file((out_dir / "logs" / ("rank_" + std::to_string(env.rank) + ".log")).string());
  if (leader) engine::write_text_durably(out_dir / "strategy.toml", resolved_strategy_toml(plan));
}

// The process set up before the model and data allocate: host memory policy and cap, threads,
// what the rank log says about where it runs, denormals, the seed.
void Trainer::Impl::configure_process() {
  configure_host_memory(plan.job.get_string("host_memory"));  // before the model and data allocate
  CountingCpuAllocator::install();  // counts the host tensors from here on: mem_device_peak_bytes on a CPU
  if (const int64_t cap_mib = plan.job.get_int("rank_memory_limit_mb"); cap_mib > 0) {
    const double footprint = allocated_bytes(), limit = cap_allocations(static_cast<double>(cap_mib) * (1 << 20));
    log::record("memory cap: this rank may allocate " + std::to_string(cap_mib) + " MiB more than its " +
                std::to_string(static_cast<int64_t>(footprint / (1 << 20))) + " MiB at start (RLIMIT_DATA " +
                std::to_string(static_cast<int64_t>(limit / (1 << 20))) + " MiB)");
  }
  const int64_t threads = plan.job.get_int("threads");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(threads > 0 ? threads : std::max(1u, cores / static_cast<unsigned>(env.local_size))));
  // Where this rank runs, as its launcher said: across nodes the local rank picks the device slot
  // and the thread share, so a wrong one shows here first.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  log::record("rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) + ", local rank " +
              std::to_string(env.local_rank) + " of " + std::to_string(env.local_size) + " on host " + host + " (launcher " +
              env.launcher + "), device " + device.str() + ", " + std::to_string(at::get_num_threads()) + " threads");
  // The CPU and the fast paths its kernels chose (decided when the plugins loaded; `strata ops`).
  log::record("cpu " + cpu_features().model + ": " + cpu_features_line());
  for (const CpuPathChoice& c : cpu_paths()) log::record("cpu path " + c.path + " (" + c.serves + "): " + c.chosen + " - " + c.why);
  // Denormal floats make CPU arithmetic many times slower (seen: PyTorch eager's backward 3.7x
  // slower by the fourth step of a GPT); flushing them to zero changes results only below 1e-38.
  at::globalContext().setFlushDenormal(true);
  at::manual_seed(static_cast<uint64_t>(plan.job.get_int("seed")));
}

// The job: this rank's model, the dataset, the optimizer's factory.
void Trainer::Impl::build_job() {
  job = std::make_unique<Job>(plan.job, plan.model, plan.data, plan.optimizer, device);
  job->topology = topology;
  // The micro-batch in flight, for the supervisor's hang report (pipelines run them out of order).
  job->add_hook(HookPoint::BeforeForward, [this](StepContext& c) { progress->beat_micro(c.micro, false); });
  job->add_hook(HookPoint::BeforeBackward, [this](StepContext& c) {
    progress->beat_micro(c.micro, true);
    if (c.micro == 0) inject_fault(env.rank, c.step, "backward");
  });
  // Split layers hold only this rank's tensor-parallel piece, a pipeline rank only its stages.
  // A resume that found a disk checkpoint restores from it or stops: the weights come from there.
  // (Flash snapshots alone may fail to restore, and the run then starts from init_from.)
  const bool weights_from_checkpoint = options.resume && newest.has_value();
  if (weights_from_checkpoint && plan.model.has("init_from") && !plan.model.get_string("init_from").empty())
    log::record("[model] init_from is not loaded: the weights come from " + newest->path().string());
  engine::build_rank_model(plan, order, *job, weights_from_checkpoint);
  dataset = static_cast<const DatasetFactory*>(plan.dataset_component)->open(plan.data, DataContext{fs::current_path()});
  // check_data said so at plan time when it could open the data; a job started without a plan did not.
  if (const std::string problem = engine::vocabulary_problem(*dataset, job->model->vocab_size()); !problem.empty()) throw UserError(problem);
  const auto* optimizer_factory = static_cast<const OptimizerFactory*>(plan.optimizer_component);
  job->make_optimizer = [this, optimizer_factory](std::vector<ParamGroup> groups) {
    return optimizer_factory->create(std::move(groups), plan.optimizer);
  };
}

// The step: the sampler, core's step program, then every pass applied in order, and the states a
// checkpoint saves.
void Trainer::Impl::compose_step() {
  // check_plan checked that the batch splits (check_sizes in strategy_resolve.cpp).
  global_batch = plan.job.get_int("global_batch");
  const int64_t micro_batch = micro_batch_size(plan);
  micro_count = global_batch / topology->size(Dim::Data) / micro_batch;
  steps = plan.job.get_int("steps");
  seq_len = job->model->seq_len();
  sampler = std::make_unique<engine::BatchSampler>(*dataset, seq_len, static_cast<uint64_t>(plan.job.get_int("seed")),
                                                   plan.job.get_bool("shuffle"));

  // Core's step program, then the passes own or wrap its stages (their Claims say which).
  engine::provide_core_step(*job, *sampler, optimizer, engine::BatchShape{micro_batch, micro_count});
  // Each validation batch read is a beat (whichever stage evaluates: core's, a pipeline's): an
  // evaluation of many batches is progress to the hang watch, not a silent phase.
  job->validation_batch = [this, read = job->validation_batch](int64_t index) {
    progress->beat();
    inject_fault(env.rank, step, "evaluation");
    return read(index);
  };
  if (options.loss) job->loss = ProgramLoss{options.loss};
  job->register_state("model", engine::model_state(job->model));
  OperatorTable::global().bind(*job);  // stateful operator implementations reach the job's groups
  for (size_t i : order) {
    const Pass& pass = *plan.passes[i].pass;
    job->program.begin_pass(pass.name(), pass.claims());
    pass.apply(*job, plan.passes[i].config);
    job->program.end_pass();
    if (options.loss && !job->loss.target<ProgramLoss>())
      throw UserError("pass " + pass.name() + " replaces the loss with its own, so the program's loss function cannot be used with "
                      "it; disable the pass or train with core's cross entropy (no loss function)");
  }
  job->register_state("buffers", engine::buffer_state(job->model));  // after the passes: a pipeline stage's own
  log::record("step program:\n" + describe_step_program(job->program));  // the rank log keeps what ran

  optimizer = job->make_optimizer(engine::parameter_groups(*job->model, plan.optimizer));
  job->register_state("optimizer", engine::optimizer_state(*optimizer, *job->model));
  job->register_state("data", engine::data_state(*sampler));
  job->register_state("rng", engine::rng_state());
  for (const auto& p : job->model->parameters()) params.push_back(p);
}

// What the loop needs around the step: the optimizer, the learning-rate schedule, the console,
// flash snapshots.
void Trainer::Impl::prepare_loop() {
  schedule.emplace(engine::LrSchedule{plan.optimizer.get_float("lr"), plan.optimizer.get_string("schedule"),
                                      plan.optimizer.get_int("warmup_steps"), steps, plan.optimizer.get_float("min_lr_ratio"),
                                      plan.optimizer.get_float("decay_fraction"), plan.optimizer.get_string("decay_shape")});
  // MFU over every device that computes the step's tokens (the console's tokens/s counts all ranks').
  const int64_t devices = topology->world().size();
  const MfuPeak peak = mfu_peak(plan.job.get_float("peak_tflops"), device, plan_facts(plan).compute_dtype, devices);
  peak_flops_all_devices_tflops = peak.per_device_tflops * static_cast<double>(devices);
  console.emplace(steps, plan.job.get_int("log_every"), job->model->training_flops_per_token(), peak_flops_all_devices_tflops,
                  /*to_stdout=*/leader);
  if (!peak.why.empty()) console->message(peak.why);
  if (topology->size(Dim::Pipeline) > 1) stage_figures.emplace(topology->group(Dim::Pipeline), device);
  const int64_t flash_every = plan.job.get_int("flash_every");
  const char* flash_env = std::getenv("STRATA_FLASH_DIR");
  if (flash_every > 0 && flash_env) flash_dir = flash_node_store(flash_env, env.node), flash.emplace(flash_dir, env.rank);
  if (flash && plan.job.get_int("snapshot_replicas") > 0)
    replicas.emplace(topology->world(), env.node, plan.job.get_int("snapshot_replicas"), flash_dir, device);
  else if (flash_every > 0 && !flash_env)
    console->message("note: [job] flash_every needs `strata run -n N` (its supervisor writes the snapshots to disk); "
                     "checkpointing to disk at checkpoint_every instead");
}

void Trainer::Impl::continue_from(int64_t resumed_step) {
  step = resumed_step;
  first_step = resumed_step + 1;
  // Snapshots of steps after the one resumed from belong to the attempt being redone.
  if (flash) flash->discard_after(step);
  if (replicas) replicas->discard_after(step);
  if (leader) metrics.reset(), metrics.emplace(out_dir / "metrics.jsonl", step);
  if (leader && plan.job.get_bool("tensorboard"))
    tensorboard.reset(), tensorboard.emplace(out_dir / "tensorboard", job->model->training_flops_per_token(), peak_flops_all_devices_tflops);
  profile_first = step + 3;
  profile_last = step + 2 + plan.job.get_int("profile_steps");
  job->model->train();
}

// A checkpoint of `step`: a flash snapshot when the supervisor persists them (falling back to
// disk for the rest of the run when any rank's shared memory cannot hold it), else a disk save.
double Trainer::Impl::save(int64_t at_step, bool to_disk) {
  const auto started = std::chrono::steady_clock::now();
  snapshot_skipped = false;
  const engine::SavedState state = engine::gather_state(*job);
  if (flash) {
    std::string problem;
    // The previous snapshot's replica transfers, waited for (and its checksum taken) before this
    // snapshot replaces it as the newest; their posting (after the previous step's record)
    // counts here too.
    const double posted_before = replica_post_seconds;
    replica_seconds = replica_post_seconds, replica_post_seconds = 0;
    if (replicas) {
      const auto replica_started = std::chrono::steady_clock::now();
      replicas->complete(*flash);
      replica_seconds += seconds_since(replica_started);
    }
    // Skipped (the supervisor is persisting this rank's older slot) is not a failure: the
    // newest snapshot stays, and the next one goes ahead.
    const FlashWrite outcome = flash->write({at_step, plan.layout.world_size, engine::state_hash(plan)}, state.tensors,
                                            engine::checkpoint_file_metadata(at_step, state.placements), problem,
                                            [&] { inject_fault(env.rank, at_step, "snapshot"); });
    // The agreement: ranks that failed, ranks that skipped and, with replicas, every rank's image
    // identity (which its receivers need to take their slots) and its last sent image's checksum.
    std::vector<int64_t> agreement{outcome == FlashWrite::Failed ? 1 : 0, outcome == FlashWrite::Skipped ? 1 : 0};
    if (replicas) {
      const std::vector<int64_t> rows = replicas->agreement_rows(*flash, outcome == FlashWrite::Written);
      agreement.insert(agreement.end(), rows.begin(), rows.end());
    }
    at::Tensor outcomes = at::tensor(agreement, at::kLong).to(device);
    topology->world().all_reduce(outcomes, ReduceOp::Sum)->wait();
    const std::vector<double> counts = read_on_host({outcomes});
    if (counts[0] == 0) {
      if (outcome == FlashWrite::Written && inject_fault(env.rank, at_step, "snapshot_done")) flash->damage_newest();
      snapshot_skipped = counts[1] > 0;
      replica_post_due = replicas && !snapshot_skipped;  // every rank has this step's image: sent after the step's record
      if (replicas) {
        const auto agreeing = std::chrono::steady_clock::now();
        replicas->agreed({counts.begin() + 2, counts.end()}, /*announce=*/replica_post_due);
        replica_seconds += seconds_since(agreeing);
      }
      return seconds_since(started) + posted_before;
    }
    replicas.reset();
    console->message("flash checkpoints off: " + (problem.empty() ? std::string("another rank's shared memory is full") : problem) +
                     "; checkpointing to disk");
    flash.reset();
    to_disk = true;
  }
  if (to_disk)
    engine::save_checkpoint(checkpoints_dir, {at_step, engine::state_hash(plan), plan.layout.world_size}, engine::for_disk(state.tensors),
                            state.placements, plan.job.get_int("keep_checkpoints"), topology->world(), device,
                            [this, at_step] {
                              progress->beat();
                              inject_fault(env.rank, at_step, "checkpoint");
                            });
  return seconds_since(started);
}

double Trainer::Impl::evaluate(int64_t at_step) {
  at::NoGradGuard no_grad;
  job->model->eval();
  StepContext context;
  context.step = at_step;
  job->run_hooks(HookPoint::BeforeEvaluate, context);
  job->program.run(Stage::Evaluate, context);
  job->run_hooks(HookPoint::AfterEvaluate, context);
  job->model->train();
  return context.val_loss;
}

Trainer::Trainer(const ResolvedStrategy& plan, std::vector<size_t> order, const ComponentRegistry& registry, RunOptions options)
    : impl_(std::make_unique<Impl>(plan, std::move(order), registry, std::move(options))) {
  if (impl_->options.resume) load();
  else impl_->continue_from(0);
}

Trainer::~Trainer() = default;

const StepRecord& Trainer::step() { return impl_->advance(/*read_figures=*/true); }

// One optimizer step. Its loss, gradient norm and memory figures stay where they are (on a GPU,
// reading one waits until the device's queue has drained) unless `read_figures` or the step
// logs, evaluates, checkpoints or is profiled: then every step not read yet is read at once,
// after this step has been queued, and recorded (metrics.jsonl, the console).
const StepRecord& Trainer::Impl::advance(bool read_figures) {
  Job& job = *this->job;
  if (step >= steps) throw UserError("[job] steps = " + std::to_string(steps) + " are done: the learning-rate schedule ends there");
  const int64_t at_step = step + 1;
  const Config& job_cfg = plan.job;
  if (at_step == profile_first && profile_last >= profile_first) profile.start(/*device_kernels=*/!device.is_cpu());
  progress->beat(at_step, StepPhase::Starting);
  // A kill between steps finds the previous snapshot whole: its checksum thread may not have run
  // yet on a loaded machine, and a kill during a snapshot is kill_in_snapshot's case.
  inject_fault(env.rank, at_step, "step", [&] {
    if (flash) flash->wait();
  });
  CountingCpuAllocator::install().trim_idle_blocks();  // host_memory = "cache": what the last step did not take goes back
  const auto started = std::chrono::steady_clock::now();
  const int64_t reads_before = host_read_count();
  if (unread.empty()) unread_since = started;
  for (auto& p : params) p.mutable_grad() = at::Tensor();
  StepContext context;
  context.step = at_step;
  context.micro_count = micro_count;
  job.program.run(Stage::PrepareBatches, context);
  progress->beat(at_step, StepPhase::BatchesReady);
  job.program.run(Stage::Gradients, context);
  progress->beat(at_step, StepPhase::GradientsDone);
  job.program.run(Stage::ClipGradients, context);
  progress->beat(at_step, StepPhase::Clipped);
  context.lr = schedule->at(at_step);
  job.run_hooks(HookPoint::BeforeStep, context);
  const engine::MemoryFigures memory = engine::memory_figures(job);
  job.program.run(Stage::OptimizerStep, context);
  job.run_hooks(HookPoint::AfterStep, context);
  job.model->after_optimizer_step(topology->group({Dim::Data, Dim::Context}));
  // The model's figures: its modules' on this rank; with a pipeline, summed over the stages when
  // the step is read (engine/stage_figures.h).
  std::vector<std::pair<std::string, double>> model_metrics;
  job.model->collect_metrics(model_metrics);
  engine::StageFigures::Figures model_figures = model_device_figures(*job.model);
  if (stage_figures) {
    for (const auto& [name, value] : model_metrics) model_figures.emplace_back(name, at::scalar_tensor(value, at::kDouble));
  } else {
    context.metrics.insert(context.metrics.end(), model_metrics.begin(), model_metrics.end());
    for (const auto& [name, value] : model_figures) job.program.report_device_figure(name, value);
    model_figures.clear();
  }
  progress->beat(at_step, StepPhase::Updated);

  UnreadStep& done = unread.emplace_back();
  done.record.step = at_step;
  done.record.lr = context.lr;
  done.record.tokens = global_batch * seq_len;
  done.record.extra = context.metrics;  // summed by name when read (read_unread)
  done.device_figures = job.program.take_device_figures();
  done.model_figures = std::move(model_figures);
  done.loss = job.reduce_loss(context.local_loss);
  done.grad_norm = context.grad_norm;
  done.memory = {memory.params, memory.grads, memory.optimizer, memory.peak, memory.device_peak};
  done.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  done.host_reads = host_read_count() - reads_before;
  done.skipped = context.skip_step;
  if (const at::Tensor flag = job.program.skip_flag(); flag.defined()) done.skip_flag = flag.clone();  // the pass's flag changes every step
  step = at_step;

  const int64_t eval_every = job_cfg.get_int("eval_every"), checkpoint_every = job_cfg.get_int("checkpoint_every");
  const bool eval_due = eval_every > 0 && (at_step % eval_every == 0 || at_step == steps);
  // A checkpoint is taken before the step is recorded, so its record says what it blocked.
  const bool disk_due = (checkpoint_every > 0 && at_step % checkpoint_every == 0) || (at_step == steps && job_cfg.get_bool("checkpoint_at_end"));
  const bool save_due = disk_due || (flash && at_step % job_cfg.get_int("flash_every") == 0);
  const bool profiled = at_step >= profile_first && at_step <= profile_last;
  if (leader && at_step == steps && profile_last >= profile_first && at_step < profile_first)
    console->message("note: [job] profile_steps: no step was profiled: profiling starts after 2 warm-up steps, at step " +
                     std::to_string(profile_first) + ", and this run ended at step " + std::to_string(at_step));
  if (!(read_figures || eval_due || save_due || profiled || at_step % job_cfg.get_int("log_every") == 0)) return done.record;

  read_unread();
  stop_if_diverged();  // before this step's evaluation and checkpoint
  StepRecord& record = unread.back().record;
  if (profiled) {
    profile.add_step(record.step_ms);
    if (at_step == profile_last || at_step == steps) {
      profile.stop();
      const fs::path file = out_dir / ("profile_rank" + std::to_string(env.rank) + ".md");
      profile.write(file, "Operator profile of rank " + std::to_string(env.rank) + ", steps " + std::to_string(profile_first) + ".." +
                              std::to_string(at_step));
      if (leader)
        console->message("operator profile of steps " + std::to_string(profile_first) + ".." + std::to_string(at_step) + " written to " +
                         file.string());
    }
  }
  if (eval_due) {
    progress->beat(at_step, StepPhase::Evaluating);
    const int64_t reads_before_evaluation = host_read_count();
    record.val_loss = evaluate(at_step);
    for (auto& [name, value] : record.extra)  // the evaluation's reads count in its step's
      if (name == "host_reads") value += static_cast<double>(host_read_count() - reads_before_evaluation);
  }
  if (save_due) {
    progress->beat(at_step, StepPhase::Checkpointing);
    const double blocked = save(at_step, disk_due);
    progress->add_checkpoint_time(blocked, replica_seconds);
    // A snapshot some rank skipped (its older slot was being persisted) is told apart: it cost
    // the agreement only, and the newest complete snapshot is an older one.
    record.extra.emplace_back(snapshot_skipped ? "snapshot_skipped_ms" : "checkpoint_ms", blocked * 1000.0);
    if (replicas) record.extra.emplace_back("replica_ms", replica_seconds * 1000.0);  // of checkpoint_ms
  }
  record_unread();
  // Replicas are sent once this step's record is written: a rank lost while they are on their
  // way leaves a snapshot a restart resumes from, and its step's line must be in metrics.jsonl.
  if (replica_post_due) {
    replica_post_due = false;
    const auto posting = std::chrono::steady_clock::now();
    replicas->post(*flash);
    replica_post_seconds = seconds_since(posting);
  }
  return last;
}

// A step whose loss or gradient norm is not finite and that no pass skipped (amp skips fp16
// overflows) has put NaN or inf into the weights: every later step and checkpoint would carry
// them, and with keep_checkpoints the good ones would rotate out. Megatron stops there too
// (check_for_nan_in_loss_and_grad). With [job] nonfinite = "stop" the run ends at the first such
// step read, before that step's evaluation and checkpoint, on every rank alike (the loss and the
// norm are reduced over the ranks): its metrics are recorded, and the one line says what to change.
void Trainer::Impl::stop_if_diverged() {
  if (plan.job.get_string("nonfinite") != "stop") return;
  for (const UnreadStep& u : unread) {
    const StepRecord& r = u.record;
    if (u.skipped || (std::isfinite(r.loss) && std::isfinite(r.grad_norm))) continue;
    const bool loss = !std::isfinite(r.loss);
    std::ostringstream value;
    value << (loss ? r.loss : r.grad_norm);
    const std::vector<fs::path> saved = engine::checkpoint_dirs_newest_first(checkpoints_dir);
    record_unread();
    throw UserError("training diverged at step " + std::to_string(r.step) + ": the " + (loss ? "loss" : "gradient norm") + " is " +
                    value.str() + " and no pass skipped the step, so the weights are no longer finite; " +
                    (saved.empty() ? std::string("no checkpoint was saved before it")
                                   : "the newest checkpoint, " + saved.front().filename().string() + ", was saved before it") +
                    ". Lower [optimizer] lr or raise warmup_steps, or set grad_clip, and resume; [job] nonfinite = \"continue\" trains on regardless");
  }
}

// The figures of every unread step in one read: losses, gradient norms and, across ranks, the
// largest memory figures (what the busiest rank needs). On a device with a queue the host's time
// per step says when a step was queued, not when it ran, so each unread step is given the mean
// wall time since the first of them started; on the CPU, where work runs as it is issued, its own.
// `across_ranks`: every rank is here (the largest memory figures are agreed); otherwise this
// rank's own.
void Trainer::Impl::read_unread(bool across_ranks) {
  if (unread.empty()) return;
  // The model's figures are summed over the pipeline's stages where every rank is here; otherwise
  // (a failure) this rank's own are read with its other figures.
  const bool stages_summed = stage_figures && across_ranks;
  std::vector<engine::StageFigures::Figures> model_figures;
  for (auto& u : unread) {
    if (stages_summed)
      model_figures.push_back(std::move(u.model_figures));
    else
      u.device_figures.insert(u.device_figures.end(), u.model_figures.begin(), u.model_figures.end());
    u.model_figures.clear();
  }
  std::vector<at::Tensor> values;
  std::vector<double> memory;
  for (const auto& u : unread) values.push_back(u.loss), values.push_back(u.grad_norm);
  for (const auto& u : unread)
    for (const auto& figure : u.device_figures) values.push_back(figure.second);
  for (const auto& u : unread)
    if (u.skip_flag.defined()) values.push_back(u.skip_flag);
  for (const auto& u : unread) memory.insert(memory.end(), u.memory.begin(), u.memory.end());
  const bool memory_agreed = across_ranks && topology->world().size() > 1;
  // A stop signal rides on the memory figures' all-reduce (max): every rank learns at the same
  // read whether any was signalled, without a collective of its own.
  const bool ask_signal = memory_agreed && rank_signalled;
  if (ask_signal) memory.push_back(rank_signalled() ? 1.0 : 0.0);
  if (memory_agreed) {
    at::Tensor memory_max = at::tensor(memory, at::kDouble).to(device);
    topology->world().all_reduce(memory_max, ReduceOp::Max)->wait();
    values.push_back(memory_max);
  }
  const int64_t reads_before = host_read_count();
  if (stages_summed) values.push_back(stage_figures->reduce(model_figures));
  const std::vector<double> figures = read_on_host(values);
  const size_t n = unread.size();
  auto next = figures.begin() + static_cast<std::ptrdiff_t>(2 * n);  // the device figures, the memory figures, the stage sums
  for (auto& u : unread)
    for (const auto& [name, value] : u.device_figures) u.record.extra.emplace_back(name, *next++);
  for (auto& u : unread)
    if (u.skip_flag.defined()) u.skipped = *next++ != 0 || u.skipped;
  if (memory_agreed) memory.assign(next, next + static_cast<std::ptrdiff_t>(memory.size())), next += static_cast<std::ptrdiff_t>(memory.size());
  if (ask_signal) any_rank_signalled = memory.back() > 0, memory.pop_back();
  if (stages_summed) {
    const std::vector<engine::StageFigures::Named> summed = stage_figures->decode(std::vector<double>(next, figures.end()), model_figures);
    for (size_t i = 0; i < n; ++i) unread[i].record.extra.insert(unread[i].record.extra.end(), summed[i].begin(), summed[i].end());
  }
  const int64_t this_read = host_read_count() - reads_before;  // counted on the newest step
  const double mean_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - unread_since).count() /
                         static_cast<double>(n);
  const char* memory_names[] = {"mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mem_peak_bytes", "mem_device_peak_bytes"};
  const size_t kinds = std::size(memory_names);
  for (size_t i = 0; i < n; ++i) {
    StepRecord& r = unread[i].record;
    r.loss = figures[2 * i];
    r.grad_norm = figures[2 * i + 1];
    r.step_ms = device.is_cpu() ? unread[i].host_ms : mean_ms;
    for (size_t k = 0; k < kinds; ++k) r.extra.emplace_back(memory_names[k], memory[kinds * i + k]);
    r.extra.emplace_back("host_reads", static_cast<double>(unread[i].host_reads + (i + 1 == n ? this_read : 0)));
    r.extra = engine::summed_by_name(r.extra);
  }
}

// Records the unread steps (read by read_unread) in order, and keeps the newest as `last`.
void Trainer::Impl::record_unread() {
  for (auto& u : unread) {
    if (metrics) metrics->write(u.record);
    if (tensorboard) tensorboard->write(u.record);
    console->step(u.record);
  }
  if (!unread.empty()) last = std::move(unread.back().record);
  unread.clear();
}

RunSummary Trainer::run() {
  return run([] { return false; });
}

RunSummary Trainer::run(const std::function<bool()>& stop_requested) {
  Impl& t = *impl_;
  // Ranks a launcher of another kind started stop together: a signal any of them got is agreed
  // at the next read of the figures (a logging step), and all stop after that step.
  const bool agreed = t.topology->world().size() > 1;
  if (agreed) t.rank_signalled = stop_requested;
  RunSummary summary{t.first_step, t.step, t.last.loss};
  try {
    // The supervisor's graceful stop (strata run -n N): every rank stops after the same step,
    // one the supervisor chose past every rank's.
    const auto supervisor_stop = [&t] { return t.progress->stop_after() > 0 && t.step >= t.progress->stop_after(); };
    const auto requested = [&] { return agreed ? t.any_rank_signalled : stop_requested(); };
    while (t.step < t.steps && !requested() && !supervisor_stop()) t.advance(/*read_figures=*/false);
  } catch (...) {
    // The steps done before the failure are recorded, as when every step was read, with this
    // rank's own memory figures: the other ranks are not at this point, so no collective.
    try {
      t.read_unread(/*across_ranks=*/false);
      t.record_unread();
    } catch (...) {
    }
    throw;
  }
  t.read_unread();  // a stop between reads
  t.stop_if_diverged();
  t.record_unread();
  summary.last_loss = t.last.loss;
  summary.last_step = t.step;
  if (t.replicas) t.replicas->finish(*t.flash);  // the last snapshot's replicas count too
  if (t.flash) t.flash->wait();  // the last snapshot is valid before the supervisor persists it
  if (t.step == t.steps) t.progress->beat(t.steps, StepPhase::Finished);
  t.console->finish();
  return summary;
}

double Trainer::save() {
  impl_->progress->beat(impl_->step, StepPhase::Checkpointing);
  return impl_->save(impl_->step, /*to_disk=*/true);
}

int64_t Trainer::completed_steps() const { return impl_->step; }
int64_t Trainer::total_steps() const { return impl_->steps; }
const StepRecord& Trainer::metrics() const { return impl_->last; }
Job& Trainer::job() { return *impl_->job; }

RunSummary run_training(const ResolvedStrategy& plan, const std::vector<size_t>& order, const ComponentRegistry& registry,
                        const RunOptions& options) {
  return Trainer(plan, order, registry, options).run();
}

}  // namespace strata
