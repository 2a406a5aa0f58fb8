// The cuda_graph pass: the gradients stage (forward, loss and backward of every micro-batch)
// recorded once as a CUDA graph and replayed in each later step, so the host issues one launch
// where it issued a kernel at a time. On a GPU the host's launches, not the device, set the pace
// of a small model's step (GPT-2 124M in bf16 on an H200: 815 launches, 24.7 ms of wall time
// a step for 22.2 ms of device time; bench/results/step_time_cuda_bf16.md): the replay removes
// that gap, as torch.compile's mode="reduce-overhead" does for PyTorch.
//
// How, in the field's terms (PyTorch's whole-network capture): `warmup_steps` steps run as
// issued (the optimizer's state, cuBLAS's workspaces and the allocator settle); the next step's
// gradients are captured with every gradient unset, so the backward allocates them in the
// graph's pool, and each replay overwrites them in place. The replay reads the micro-batches from
// the tensors the capture read (each step's batches are copied into them) and leaves the loss
// where the capture left it (copied out, since unread steps keep theirs). Clipping and the
// optimizer step run outside the graph, as issued: the learning rate and the step count change
// every step, and they are a few multi-tensor launches.
//
// What a replay cannot do is refused at plan time: anything that reads the device on the host
// mid-step or counts on the host (the mixture-of-experts layers), amp fp16's scaler (on the device, but
// never replayed on a GPU yet), host
// randomness per step (dropout masks are seeded per step), collectives (one process only) and
// shapes that change. A step that still waits for the device fails its capture with a clear
// line. Host-side figures counted during the gradients (amp_precast_tensors) count the captured
// step only.
#include <algorithm>
#include <iostream>

#include "step_graph.h"
#include "strata/plugin.h"

namespace strata::cuda_graph {
namespace {

bool enabled(const PlanFacts& facts, const char* pass) {
  return std::find(facts.enabled_passes.begin(), facts.enabled_passes.end(), pass) != facts.enabled_passes.end();
}

// The graph, what it reads and what it leaves, and how many steps ran before it.
struct Replay {
  int64_t warmup_steps = 0;
  int64_t steps_seen = 0;
  std::unique_ptr<StepGraph> graph;
  std::vector<at::Tensor> batches;  // the capture's inputs
  std::vector<at::Tensor> params;   // the job's parameters, and their gradients as the graph leaves them
  std::vector<at::Tensor> grads;
  at::Tensor local_loss;
};

void replay_gradients(Job& job, Replay& r, StepContext& context, const StageFn& inner) {
  if (r.steps_seen++ < r.warmup_steps) return inner(context);
  if (!r.graph) {
    r.batches = context.batches;
    r.params = job.model->parameters();
    for (const at::Tensor& p : r.params)
      if (p.grad().defined()) throw std::logic_error("cuda_graph: a gradient was set before the step's capture");
    // Blocks reseed the generators for keyed dropout masks, which a capture forbids; nothing
    // draws here (dropout > 0 was refused), so the recorded step is the same without it.
    r.graph = std::make_unique<StepGraph>(job.device(), [&] {
      const nn::UnkeyedRandomness unkeyed;
      inner(context);
    }, "pass 'cuda_graph': the gradients stage");
    for (const at::Tensor& p : r.params) r.grads.push_back(p.grad());
    r.local_loss = context.local_loss;
    std::cout << "cuda_graph: the gradients stage recorded at step " << context.step << " and replayed from there\n";
  } else {
    if (context.batches.size() != r.batches.size())
      throw UserError("pass 'cuda_graph': step " + std::to_string(context.step) + " has " + std::to_string(context.batches.size()) +
                      " micro-batches, the recorded step " + std::to_string(r.batches.size()));
    for (size_t i = 0; i < r.batches.size(); ++i) {
      if (!context.batches[i].sizes().equals(r.batches[i].sizes()))
        throw UserError("pass 'cuda_graph': a micro-batch of step " + std::to_string(context.step) +
                        " has another shape than the recorded step's; a replay needs the same shapes");
      r.batches[i].copy_(context.batches[i], /*non_blocking=*/true);
    }
  }
  r.graph->replay();
  for (size_t i = 0; i < r.params.size(); ++i) r.params[i].mutable_grad() = r.grads[i];
  context.local_loss = r.local_loss.clone();
  context.metrics.emplace_back("cuda_graph_replayed", 1.0);
}

class CudaGraphPass final : public Pass {
 public:
  CudaGraphPass()
      : Pass({ComponentKind::Pass, "cuda_graph",
              "The gradients stage recorded once as a CUDA graph and replayed each step (one launch for the forward and "
              "backward): one process on one GPU, static shapes",
              Schema().integer("warmup_steps", 2, "Steps run as issued before the gradients are recorded", at_least(1))},
             // Last: the graph records the gradients stage with every wrapper other passes put
             // around it (amp's autocast, fp8's scaling) inside.
             {Phase::Runtime, {}, {"wsam", "fsdp", "zero1", "zero2"},
              {"amp", "half", "fp8", "fused_loss", "module_replace", "act_checkpoint"}, {}},
             {{}, {{Stage::Gradients, StageUse::Wrap}}}) {}

  std::string plan_problem(const Config&, const PlanFacts& facts) const override {
    if (facts.device != c10::DeviceType::CUDA)
      return "pass 'cuda_graph': records CUDA work; set [job] device = \"cuda\"";
    const MeshSizes& m = facts.mesh;
    if (m.data * m.tensor * m.pipeline * m.context > 1)
      return "pass 'cuda_graph': runs on one process (the mesh has " + std::to_string(m.data * m.tensor * m.pipeline * m.context) +
             " ranks); its collectives are not recorded";
    if (facts.compute_dtype == c10::ScalarType::Half && enabled(facts, "amp"))
      return "pass 'cuda_graph': amp fp16's loss scaler (its check on the device) has not been replayed in a graph on a GPU "
             "yet; use amp dtype = \"bf16\"";
    if (facts.model.has("dropout") && facts.model.get_float("dropout") > 0)
      return "pass 'cuda_graph': [model] dropout = " + c10::str(facts.model.get_float("dropout")) +
             " draws masks seeded per step on the host, which a replay would repeat; set dropout = 0";
    if (facts.model.has("n_experts") && facts.model.get_int("n_experts") > 0)
      return "pass 'cuda_graph': the mixture-of-experts layers count their forwards and figures on the host (and with "
             "expert_rows = \"packed\" read their experts' group sizes in every forward), which a replay would not run";
    return {};
  }

  void apply(Job& job, const Config& config) const override {
    auto replay = std::make_shared<Replay>();
    replay->warmup_steps = config.get_int("warmup_steps");
    job.program.wrap(Stage::Gradients, [&job, replay](StepContext& context, const StageFn& inner) {
      replay_gradients(job, *replay, context, inner);
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<CudaGraphPass>()); }

}  // namespace
}  // namespace strata::cuda_graph

STRATA_PLUGIN("cuda_graph", "0.1.0", strata::cuda_graph::register_components)
