// Pipeline parallel: the model's blocks split into stages over [parallel] pipeline ranks, each
// step's micro-batches run through them under a schedule (strata/pipeline.h) that core checks
// by simulation and this pass's runtime executes action by action.
//
// Every rank cuts the model into stages from its outline (block names and sizes, no values) and
// asks core to build only its own blocks (blocks_to_build): core still runs the whole factory in
// order, so initialisation draws the single-process values, but each other block is dropped as
// soon as it is built, so a rank never holds the whole model. A balanced partition measures every
// block (rank 0's figures, broadcast), so there every rank builds the whole model first. apply()
// drops the absent blocks before any wrapping pass sees the model.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include <ATen/ATen.h>

#include "partition.h"
#include "schedules.h"
#include "stage_runtime.h"
#include "strata/model.h"
#include "strata/plugin.h"
#include "strata/rng.h"

namespace strata::pipeline {
namespace {

constexpr int64_t kBalanceRepeats = 3;  // [pass] balance_repeats's default

struct Settings {
  const Schedule* schedule = nullptr;
  ScheduleShape shape;
};

// The schedule and shape this pass's config asks for over `mesh`, or why it cannot run.
std::string resolve_settings(const Config& config, const MeshSizes& mesh, Settings& out) {
  if (mesh.pipeline < 2) return "pass 'pipeline_parallel' needs [parallel] pipeline >= 2, got " + std::to_string(mesh.pipeline);
  const std::string& name = config.get_string("schedule");
  out.schedule = find_schedule(name);
  if (!out.schedule) {
    std::string known;
    for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
    return "pass 'pipeline_parallel': schedule '" + name + "' is not registered (known: " + known + ")";
  }
  const int requested = static_cast<int>(config.get_int("chunks"));
  const int chunks = out.schedule->chunks(requested);
  if (requested > 1 && chunks != requested)
    return "pass 'pipeline_parallel': schedule '" + name + "' runs one chunk per rank; chunks = " + std::to_string(requested) +
           " needs schedule \"interleaved\"";
  out.shape = {static_cast<int>(mesh.pipeline), static_cast<int>(mesh.micro_batches), std::max(1, chunks)};
  if (std::string problem = out.schedule->shape_problem(out.shape); !problem.empty())
    return "pass 'pipeline_parallel': schedule '" + name + "' " + problem;
  const bool has_layout = !config.get_strings("layout").empty(), wants_layout = config.get_string("partition") == "layout";
  if (has_layout != wants_layout)
    return has_layout ? "pass 'pipeline_parallel': layout is set but partition = \"" + config.get_string("partition") +
                            "\"; set partition = \"layout\" to use it"
                      : "pass 'pipeline_parallel': partition = \"layout\" needs layout (block names per stage)";
  if (config.get_float("stage_memory_gb") > 0 && config.get_string("partition") != "balanced")
    return "pass 'pipeline_parallel': stage_memory_gb applies only to partition = \"balanced\"";
  if (config.get_int("balance_repeats") != kBalanceRepeats && config.get_string("partition") != "balanced")
    return "pass 'pipeline_parallel': balance_repeats applies only to partition = \"balanced\"";
  return {};
}

// The partition of `model` (the whole model, at this rank's tensor-parallel shapes) into the
// schedule's virtual stages, with block costs when balanced.
Partition partition_model(const nn::Model& model, const Config& config, const Config& job, const Settings& s,
                          const std::vector<BlockCost>& costs, std::string& problem) {
  const int stages = s.shape.virtual_stages();
  if (model.num_blocks() < static_cast<size_t>(stages)) {
    problem = "pass 'pipeline_parallel': the model has " + std::to_string(model.num_blocks()) + " blocks, fewer than the " +
              std::to_string(stages) + " stages (pipeline x chunks)";
    return {};
  }
  const std::string& how = config.get_string("partition");
  if (how == "layout") {
    Partition out = layout_partition(model, config.get_strings("layout"), stages, problem);
    if (!problem.empty()) problem = "pass 'pipeline_parallel': " + problem;
    return out;
  }
  if (how == "uniform") return uniform_partition(model.num_blocks(), stages);
  // Balanced: the in-flight micro-batches of each virtual stage from the simulated schedule.
  const Simulation sim = simulate(add_communication(s.schedule->compute_order(s.shape), s.shape), s.shape);
  std::vector<int> in_flight;
  for (int v = 0; v < stages; ++v) in_flight.push_back(sim.peak_in_flight.empty() ? 1 : sim.peak_in_flight[static_cast<size_t>(v % s.shape.ranks)]);
  const double cap = config.get_float("stage_memory_gb") * 1e9;
  Partition out = balanced_partition(costs, in_flight, cap);
  if (out.empty()) problem = "pass 'pipeline_parallel': no split of the model's blocks fits stage_memory_gb = " + std::to_string(config.get_float("stage_memory_gb"));
  (void)job;
  return out;
}

// What a rank holds at the schedule's peak, in micro-batches x chunks: those forwarded whose input
// gradient has not run (their activations) and those whose input gradient has but whose deferred
// weight gradients have not. The peak is the most of both together on any rank (what
// Simulation::peak_in_flight counts), and of those the one with the most deferred: what is left
// when activation checkpointing shrinks the activations (the last rank of a zero-bubble schedule
// holds every micro-batch's weight gradients after its last input gradient).
struct HeldAtPeak {
  double activations = 0, weight_gradients = 0;
};

HeldAtPeak held_at_peak(const Simulation& sim) {
  HeldAtPeak peak;
  for (const auto& rank : sim.timeline) {
    int activations = 0, weight_gradients = 0;
    for (const TimedAction& t : rank) {
      switch (t.action.kind) {
        case ActionKind::Forward: ++activations; break;
        case ActionKind::Backward: --activations; break;
        case ActionKind::BackwardInput: --activations, ++weight_gradients; break;
        case ActionKind::BackwardWeight: --weight_gradients; break;
        default: break;
      }
      const double total = activations + weight_gradients, peak_total = peak.activations + peak.weight_gradients;
      if (total > peak_total || (total == peak_total && weight_gradients > peak.weight_gradients))
        peak = {static_cast<double>(activations), static_cast<double>(weight_gradients)};
    }
  }
  return peak;
}

// The model at tensor rank 0's shapes for plan-time checks and the printed stages: its outline
// (every block absent) unless `with_values` (a balanced partition measures the blocks). Null,
// with `problem` set, when it cannot be built. The generator is left as it was (a program
// planning before it trains draws the same weights).
std::shared_ptr<nn::Model> build_for_plan(const PlanFacts& facts, bool with_values, std::string& problem) {
  const RngSnapshot rng{c10::Device(c10::kCPU)};
  std::shared_ptr<nn::Model> model;
  try {
    at::NoGradGuard no_grad;
    std::optional<nn::BlockFilter> outline;
    if (!with_values) outline.emplace([](size_t) { return false; });
    model = facts.model_factory.create_shard(facts.model, nn::TensorShard{facts.mesh.tensor, 0});
  } catch (const std::exception& e) {
    problem = e.what();
  }
  rng.restore();
  return model;
}

std::string format(const char* pattern, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, pattern, value);
  return buf;
}

// The mesh as apply() sees it, from the job's topology and batch.
MeshSizes job_mesh(const Job& job) {
  const Topology& topology = *job.topology;
  const int64_t local_batch = job.job_config().get_int("global_batch") / topology.size(Dim::Data);
  const int64_t micro_batch = job.job_config().get_int("micro_batch") > 0 ? job.job_config().get_int("micro_batch") : local_batch;
  return {topology.size(Dim::Data), topology.size(Dim::Tensor), topology.size(Dim::Pipeline), topology.size(Dim::Context),
          local_batch / micro_batch};
}

// The blocks of pipeline rank `rank`'s stages (one per chunk) in model order, and in `chunks`
// each chunk's range in that list.
std::vector<size_t> rank_blocks(const Partition& partition, const ScheduleShape& shape, int rank, std::vector<StageBlocks>& chunks) {
  std::vector<size_t> keep;
  for (int c = 0; c < shape.chunks; ++c) {
    const StageBlocks st = partition[static_cast<size_t>(c * shape.ranks + rank)];
    chunks.push_back({keep.size(), keep.size() + (st.last - st.first)});
    for (size_t b = st.first; b < st.last; ++b) keep.push_back(b);
  }
  return keep;
}

class PipelineParallelPass final : public Pass {
 public:
  PipelineParallelPass()
      : Pass({ComponentKind::Pass, "pipeline_parallel",
              "Pipeline parallel: blocks split into stages over the pipeline ranks, micro-batches run under a schedule",
              Schema()
                  .string("schedule", "1f1b", "Registered pipeline schedule: gpipe, 1f1b, interleaved, zero_bubble, or a plugin's")
                  .tuned({std::string("1f1b"), std::string("gpipe"), std::string("interleaved"), std::string("zero_bubble")})
                  .integer("chunks", 0, "Model chunks per rank for interleaved schedules; 0 = the schedule's default (interleaved: 2)",
                           between(0, 64))
                  .string("partition", "uniform", "How blocks are split into stages", {"uniform", "balanced", "layout"})
                  .strings("layout", {}, "partition = \"layout\": per stage, block names (\"embed h0 h1\") or runs (\"h2..head\")")
                  .real("stage_memory_gb", 0.0, "partition = \"balanced\": most estimated memory per stage; 0 = no cap", at_least(0))
                  .integer("balance_repeats", kBalanceRepeats, "partition = \"balanced\": timed runs of each block (the fastest counts)", between(1, 100))},
             {Phase::ModelRewrite, {}, {}, {}, {"tensor_parallel"}},
             {{Dim::Pipeline}, {{Stage::ForwardBackward, StageUse::Own}, {Stage::Evaluate, StageUse::Own}}}) {}

  std::string size_problem(const Config& config, const Config&, const MeshSizes& mesh) const override {
    Settings settings;
    return resolve_settings(config, mesh, settings);
  }

  // What the runtime would find only after every rank has built the model: more stages than
  // blocks, a layout that names a block the model lacks, leaves one out or repeats one (the model
  // is built here for its block names, as describe_plan builds it).
  std::string plan_problem(const Config& config, const PlanFacts& facts) const override {
    Settings s;
    if (!resolve_settings(config, facts.mesh, s).empty()) return {};  // size_problem says why
    const int stages = s.shape.virtual_stages();
    if (const int64_t blocks = facts.model_factory.shape(facts.model).blocks; blocks > 0 && blocks < stages)
      return "pass 'pipeline_parallel': the model has " + std::to_string(blocks) + " blocks, fewer than the " + std::to_string(stages) +
             " stages (pipeline x chunks)";
    if (config.get_string("partition") == "layout") {
      std::string problem;
      if (const auto model = build_for_plan(facts, /*with_values=*/false, problem)) {
        layout_partition(*model, config.get_strings("layout"), stages, problem);
        if (!problem.empty()) return "pass 'pipeline_parallel': " + problem;
      }
    }
    return {};
  }

  // A stage holds its share of the layers and their states; the rank with the most micro-batches
  // in flight sets the peak; the step stretches by the schedule's simulated idle fraction. Each
  // micro-batch sends its activation forward and its gradient back across every boundary.
  void estimate(const Config& config, const PlanFacts& facts, CostEstimate& c) const override {
    Settings s;
    if (!resolve_settings(config, facts.mesh, s).empty()) return;
    const double p = static_cast<double>(c.pipeline);
    c.weight_bytes /= p, c.gradient_bytes /= p, c.optimizer_bytes /= p, c.activation_bytes /= p, c.flops /= p;
    const Simulation sim = simulate(add_communication(s.schedule->compute_order(s.shape), s.shape), s.shape);
    if (!sim.problem.empty()) return;
    c.bubble = sim.idle_fraction;
    // Interleaved chunks hold 1/chunks of the stage's layers per micro-batch in flight. A micro-batch
    // waiting only for its deferred weight gradients holds what they keep, each linear's input and
    // output gradient: as many values as a GPT or Llama layer's saved activations (16h per token for
    // GPT), at the dtype the blocks compute in, and not what activation checkpointing (estimated
    // after this pass) shrinks: the recomputation re-creates them. So those count apart, as bytes
    // held outside the activations (measured, pipeline 2, 8 micro-batches, zero_bubble with
    // act_checkpoint every layer: 148 MB of live tensors, without it 144; 1F1B 51 and 70).
    const HeldAtPeak held = held_at_peak(sim);
    c.in_flight = held.activations / s.shape.chunks;
    const double compute_element_bytes = static_cast<double>(c10::elementSize(facts.compute_dtype));
    c.transient_bytes += held.weight_gradients / s.shape.chunks * c.activation_bytes * compute_element_bytes / c.activation_element_bytes;
    c.comm_bytes += 2.0 * static_cast<double>(c.micro_batches) * s.shape.chunks * c.seq_per_rank * static_cast<double>(c.micro_batch) *
                    static_cast<double>(c.model.hidden) * c.activation_element_bytes;
    // Per micro-batch and chunk: receive and send the activation, receive and send its gradient.
    c.messages += 4.0 * static_cast<double>(c.micro_batches) * s.shape.chunks;
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    Settings s;
    if (std::string problem = resolve_settings(config, facts.mesh, s); !problem.empty()) return {};
    std::ostringstream out;
    std::string build_problem;
    const bool measured = config.get_string("partition") == "balanced";
    const std::shared_ptr<nn::Model> model = build_for_plan(facts, measured, build_problem);
    if (!model) return "Pipeline: the model could not be built to show its stages (" + build_problem + ")\n";
    const int64_t micro_batch = facts.job.get_int("global_batch") / std::max<int64_t>(1, facts.mesh.data) / facts.mesh.micro_batches;
    const int64_t heads = facts.model.has("n_head") ? facts.model.get_int("n_head") / facts.mesh.tensor : 0;
    std::vector<BlockCost> costs;
    if (measured)
      costs = measure_blocks(*model, micro_batch, heads, static_cast<int>(config.get_int("balance_repeats")));
    else
      for (size_t b = 0; b < model->num_blocks(); ++b)
        costs.push_back({model->block_name(b), model->block(b).type(), nn::block_parameter_count(*model, b)});
    std::string problem;
    const Partition partition = partition_model(*model, config, facts.job, s, costs, problem);
    if (!problem.empty()) return "Pipeline: " + problem + "\n";
    const Programs programs = add_communication(s.schedule->compute_order(s.shape), s.shape);
    const Simulation sim = simulate(programs, s.shape);
    out << "Pipeline stages (" << config.get_string("partition") << " partition; memory: model states at 16 B/parameter plus"
        << " activations of the in-flight micro-batches, estimated):\n";
    for (size_t v = 0; v < partition.size(); ++v) {
      const StageBlocks st = partition[v];
      int64_t params = 0;
      double seconds = 0;
      for (size_t b = st.first; b < st.last; ++b) params += costs[b].params, seconds += costs[b].seconds;
      const int rank = static_cast<int>(v) % s.shape.ranks;
      const int flight = sim.peak_in_flight.empty() ? 1 : sim.peak_in_flight[static_cast<size_t>(rank)];
      out << "  stage " << v << " (rank " << rank << (s.shape.chunks > 1 ? ", chunk " + std::to_string(v / static_cast<size_t>(s.shape.ranks)) : "")
          << "): " << model->block_name(st.first) << (st.last - st.first > 1 ? ".." + model->block_name(st.last - 1) : "") << "  "
          << (st.last - st.first) << " blocks, " << params << " parameters";
      if (measured) out << ", " << format("%.2f ms", seconds * 1e3) << " forward+backward";
      if (measured) out << ", ~" << format("%.1f MB", stage_memory_bytes(costs, st, flight) / 1e6) << " with " << flight << " in flight";
      else out << ", ~" << format("%.1f MB", 16.0 * static_cast<double>(params) / 1e6) << " model states";
      out << "\n";
    }
    out << (measured ? "Start-up: every rank builds the whole model first (the balanced partition measures every block), then keeps "
                       "its stages\n"
                     : "Start-up: each rank builds only its stages' blocks (the others are dropped as the model is built; peak = its "
                       "blocks plus the largest other one)\n");
    out << "Schedule " << s.schedule->name() << ": p = " << s.shape.ranks << ", m = " << s.shape.micro_batches << ", v = " << s.shape.chunks
        << "; per-rank timeline (F forward, B backward, b input gradient, W weight gradient, . idle; F = b = W = 1, B = 2):\n";
    if (!sim.problem.empty())
      out << "  the schedule is invalid: " << sim.problem << "\n";
    else
      out << render_timeline(sim, s.shape) << "  simulated bubble " << format("%.3f", sim.idle_fraction) << " of the step; textbook "
          << s.schedule->bubble_formula(s.shape) << "\n";
    return out.str();
  }

  // This rank's blocks, cut from the outline as apply() cuts the model; a balanced partition
  // measures real blocks, so it builds them all.
  std::optional<std::vector<size_t>> blocks_to_build(const Config& config, const Job& job,
                                                     const std::function<const nn::Model&()>& outline) const override {
    Settings s;
    if (config.get_string("partition") == "balanced" || !resolve_settings(config, job_mesh(job), s).empty()) return std::nullopt;
    std::string problem;
    const Partition partition = partition_model(outline(), config, job.job_config(), s, {}, problem);
    if (!problem.empty()) return std::nullopt;  // apply() refuses it on the whole model
    std::vector<StageBlocks> chunks;
    return rank_blocks(partition, s.shape, job.topology->rank_in(Dim::Pipeline), chunks);
  }

  void apply(Job& job, const Config& config) const override {
    const Topology& topology = *job.topology;
    const MeshSizes mesh = job_mesh(job);
    Settings s;
    if (std::string problem = resolve_settings(config, mesh, s); !problem.empty()) throw UserError(problem);
    nn::Model& model = *job.model;
    const int p = s.shape.ranks, rank = topology.rank_in(Dim::Pipeline);

    // Balanced partitions use rank 0's measurements on every rank, so all ranks cut alike.
    std::vector<BlockCost> costs(model.num_blocks());
    if (config.get_string("partition") == "balanced") {
      const int64_t micro_batch = job.job_config().get_int("global_batch") / mesh.data / mesh.micro_batches;
      const int64_t heads = job.model_config().has("n_head") ? job.model_config().get_int("n_head") / mesh.tensor : 0;
      costs = measure_blocks(model, micro_batch, heads, static_cast<int>(config.get_int("balance_repeats")));
      std::vector<double> figures;
      for (const auto& c : costs) figures.insert(figures.end(), {c.seconds, c.activation_bytes});
      at::Tensor shared = at::tensor(figures, at::kDouble).to(job.device());
      topology.world().broadcast(shared, 0)->wait();
      shared = shared.cpu();
      for (size_t b = 0; b < costs.size(); ++b)
        costs[b].seconds = shared[static_cast<int64_t>(2 * b)].item<double>(),
        costs[b].activation_bytes = shared[static_cast<int64_t>(2 * b + 1)].item<double>();
    }
    std::string problem;
    const Partition partition = partition_model(model, config, job.job_config(), s, costs, problem);
    if (!problem.empty()) throw UserError(problem);

    // The programs are checked before anything runs: a plugin's schedule that deadlocks or
    // misses an action is refused here with what is wrong.
    const Programs programs = add_communication(s.schedule->compute_order(s.shape), s.shape);
    if (const Simulation sim = simulate(programs, s.shape); !sim.problem.empty())
      throw UserError("pass 'pipeline_parallel': schedule '" + s.schedule->name() + "' is invalid for p = " + std::to_string(p) +
                      ", m = " + std::to_string(s.shape.micro_batches) + ": " + sim.problem);

    // Tied weights: the shared parameter's owner block and the block that reads it (absent
    // blocks say whether they read one); the last stage holds the head's copy.
    std::optional<TiedWeight> tied;
    const size_t first_of_last_stage = partition.back().first;
    for (const std::string& shared : model.shared_parameters()) {
      std::optional<size_t> reader;
      size_t owner = 0;
      for (size_t b = 0; b < model.num_blocks(); ++b)
        if (nn::block_reads_tied_weight(model, b)) reader = b;
      for (size_t b = 0; b < model.num_blocks(); ++b)
        if (shared.rfind(model.block_name(b) + ".", 0) == 0) owner = b;
      if (!reader || owner >= partition.front().last || *reader < first_of_last_stage)
        throw UserError("pass 'pipeline_parallel': the shared parameter '" + shared +
                        "' is not an embedding read by the head on the last stage, which is the one tie it carries across stages");
      TiedWeight t;
      if (rank == 0) t.parameter = model.named_parameters()[shared], t.owner_block = owner;
      if (rank == p - 1) {
        for (const auto& m : model.block(*reader).modules(/*include_self=*/false))
          if (const auto* head = dynamic_cast<const nn::TiedLinear*>(m.get())) t.copy = head->embedding().weight;
        t.reader_block = *reader;
      }
      tied = t;
    }

    // This rank's stages; block indices are renumbered once the others are dropped.
    std::vector<StageBlocks> chunks;
    const std::vector<size_t> keep = rank_blocks(partition, s.shape, rank, chunks);
    const auto renumbered = [&keep](size_t b) { return static_cast<size_t>(std::find(keep.begin(), keep.end(), b) - keep.begin()); };
    if (tied && rank == p - 1) tied->reader_block = renumbered(tied->reader_block);
    if (tied && rank == 0) tied->owner_block = renumbered(tied->owner_block);
    if (tied && rank != 0 && rank != p - 1) tied.reset();
    model.keep_blocks(keep);
    for (size_t b = 0; b < model.num_blocks(); ++b)
      if (dynamic_cast<const nn::AbsentBlock*>(&model.block(b)))
        throw std::logic_error("pipeline_parallel: block '" + model.block_name(b) + "' of this rank's stages was not built");

    bool splits = false;
    for (const Action& a : programs[static_cast<size_t>(rank)]) splits |= a.kind == ActionKind::BackwardInput;
    if (splits)
      for (const auto& m : model.modules(false))
        if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) linear->split_weight_gradient = true;

    StageLayout layout{s.shape, rank, chunks, splits, s.schedule->name()};
    auto runtime = std::make_shared<StageRuntime>(job, layout, programs[static_cast<size_t>(rank)], tied);
    runtime->install_tied_weight_hooks();
    job.program.own(Stage::ForwardBackward, [runtime](StepContext& c) { runtime->run_step(c); });
    job.program.own(Stage::Evaluate, [runtime](StepContext& c) { runtime->evaluate(c); });
    job.add_hook(HookPoint::AfterStep, [runtime](StepContext&) { runtime->report_idle(); });
    // The last stage has the loss: the pipeline group sums (others add 0), then core's reduction.
    job.reduce_loss = [&job, inner = job.reduce_loss](const at::Tensor& local_loss) {
      at::Tensor sum = local_loss.to(job.device(), at::kDouble, /*non_blocking=*/false, /*copy=*/true);
      job.topology->group(Dim::Pipeline).all_reduce(sum, ReduceOp::Sum)->wait();
      return inner(sum);
    };
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<PipelineParallelPass>());
  register_schedules(registry);
}

}  // namespace
}  // namespace strata::pipeline

STRATA_PLUGIN("pipeline_parallel", "0.1.0", strata::pipeline::register_components)
