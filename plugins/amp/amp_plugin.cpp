// Automatic mixed precision: the forward (and loss) runs under libtorch's autocast in fp16 or
// bf16 while parameters, gradients and optimizer state stay fp32 (the master weights). fp16
// gradients are protected by a dynamic loss scaler: backward runs on loss x scale, gradients are
// unscaled before clipping, a step with any non-finite gradient is skipped and the scale backs
// off, and after growth_interval clean steps it grows, all of it on the device (no step reads the
// scaler on the host; Scaler below). bf16 needs no scaling; it can skip non-finite steps on
// request. The gradient-sync pass reduces gradients in reduce_dtype, and fsdp gathers full
// parameters in the compute dtype (gather_dtype) so that only the shards it keeps for the
// optimizer are fp32. Evaluation runs under the same autocast. precast_weights
// casts each block's Linear parameters together (weight_precast.h).
#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "strata/cpu.h"
#include "strata/plugin.h"
#include "weight_precast.h"

namespace strata::amp {
namespace {

// The scaler's state, on the job's device so that no step reads it on the host (the GPU's queue
// would drain), checkpointed as amp/scale (fp64), amp/growth_tracker and amp/skipped_steps
// (int64). The scale is the step program's device loss scale (StepProgram::set_device_loss_scale),
// which every backward multiplies in, and the non-finite flag its skip flag (add_skip_flag): the
// optimizer skips the update on the device (GatedOptimizer), and the scale backs off or grows
// there, with the rule of torch.amp.GradScaler's _amp_update_scale_.
class Scaler final : public Stateful {
 public:
  Scaler(double init_scale, c10::Device device)
      : scale(at::full({}, init_scale, at::TensorOptions().dtype(at::kDouble).device(device))),
        growth_tracker(at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device))),
        skipped_steps(at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device))),
        found_nonfinite(at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device))) {}

  NamedTensors save() const override {
    return {{"scale", scale.clone()}, {"growth_tracker", growth_tracker.clone()}, {"skipped_steps", skipped_steps.clone()}};
  }

  // Every rank takes the same skip and scale decisions (the non-finite check is reduced).
  bool same_on_data_ranks() const override { return true; }

  void load(const NamedTensors& tensors) override {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : tensors) {
      if (name == "scale") scale.copy_(t.reshape({}));
      else if (name == "growth_tracker") growth_tracker.copy_(t.reshape({}));
      else if (name == "skipped_steps") skipped_steps.copy_(t.reshape({}));
    }
  }

  at::Tensor scale;           // fp64; the next step's loss scale (1 for bf16)
  at::Tensor growth_tracker;  // clean steps since the scale last changed
  at::Tensor skipped_steps;
  // Within one step (not saved): 1 where any of its gradients, on any rank, was not finite. A
  // pass that runs the gradients twice (WSAM) calls the wrapper twice; the flag gathers both and
  // the scale updates once per step.
  at::Tensor found_nonfinite;
  int64_t step = -1;
};

struct Settings {
  at::ScalarType dtype;
  bool scaling;  // fp16
  bool check_nonfinite;
  double growth_factor, backoff_factor;
  int64_t growth_interval;
};

// Unscales the gradients in place and sets the flag where any of them, on any rank, is not finite,
// all on the device: ATen's fused check-and-unscale, then an all-reduce of the flag over the whole
// mesh. Every rank must take the same decision: data ranks hold replicas, and pipeline stages,
// tensor and expert ranks hold parts of one model whose step is taken whole or not at all.
void unscale_and_check(const Job& job, Scaler& scaler) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& [g, placement] : job.local_gradients())
    if (g.defined()) grads.push_back(g);
  const at::Tensor inv_scale = scaler.scale.reciprocal().to(at::kFloat).reshape({1});
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, scaler.found_nonfinite, inv_scale);
  job.topology->world().all_reduce(scaler.found_nonfinite, ReduceOp::Max)->wait();
}

// After the update: counts a skipped step, and (fp16) backs the scale off after it or grows it
// after growth_interval clean steps, on the device.
void update_scale(Scaler& scaler, const Settings& settings) {
  at::NoGradGuard no_grad;
  const at::Tensor skipped = scaler.found_nonfinite.reshape({}).ne(0);
  scaler.skipped_steps.add_(skipped.to(at::kLong));
  if (!settings.scaling) return;
  const at::Tensor counted = at::where(skipped, at::zeros_like(scaler.growth_tracker), scaler.growth_tracker + 1);
  const at::Tensor grow = counted.eq(settings.growth_interval);
  scaler.scale.copy_(at::where(skipped, scaler.scale * settings.backoff_factor,
                               at::where(grow, scaler.scale * settings.growth_factor, scaler.scale)));
  scaler.growth_tracker.copy_(at::where(grow, at::zeros_like(counted), counted));
}

at::ScalarType dtype_named(const std::string& name) {
  return name == "bf16" ? at::kBFloat16 : name == "fp16" ? at::kHalf : at::kFloat;
}

class AmpPass final : public Pass {
 public:
  AmpPass()
      : Pass({ComponentKind::Pass, "amp", "Autocast to fp16 or bf16 with fp32 master weights and a dynamic loss scaler",
              Schema()
                  .string("dtype", "bf16", "Compute dtype", {"bf16", "fp16"})
                  .real("init_scale", 65536.0, "fp16: initial loss scale", at_least(1))
                  .real("growth_factor", 2.0, "fp16: scale multiplier after growth_interval clean steps", at_least(1))
                  .real("backoff_factor", 0.5, "fp16: scale multiplier after a non-finite step", between(0, 1))
                  .integer("growth_interval", 2000, "fp16: clean steps before the scale grows", at_least(1))
                  .boolean("skip_if_nonfinite", false, "bf16: skip steps whose gradients are not finite")
                  .string("reduce_dtype", "fp32", "Dtype the data-parallel pass (ddp, zero, fsdp) averages gradients in",
                          {"fp32", "bf16", "fp16"})
                  .string("gather_dtype", "compute",
                          "fsdp: dtype full parameters are gathered and computed in (compute = dtype; fp32 = the master weights)",
                          {"compute", "fp32"})
                  .boolean("precast_weights", true,
                           "Cast each block's Linear weights and biases to dtype in one multi-tensor copy (and their "
                           "gradients back in one) instead of one kernel each: fewer launches, the same numbers (false: "
                           "autocast's own casts)")},
             {Phase::Precision, {}, {"half"}, {}, {}}, {{}, {{Stage::Gradients, StageUse::Wrap}}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    if (config.get_float("backoff_factor") <= 0 || config.get_float("backoff_factor") >= 1)
      diagnostics.error(section, "pass 'amp' backoff_factor must be strictly between 0 and 1");
    // bf16 scales no loss: the scaler's keys would be read by nothing. A saved strategy.toml
    // states every key, defaults included: only a value other than the default is a choice.
    if (config.get_string("dtype") != "fp16")
      for (const char* key : {"init_scale", "growth_factor", "backoff_factor", "growth_interval"})
        if (config.entry(key).origin != Origin::Default && config.entry(key).value != info().schema.find(key)->default_value)
          diagnostics.error(config.entry(key).pos, std::string("pass 'amp' key '") + key + "' applies to dtype \"fp16\" (loss scaling) only, not \"" +
                                                       config.get_string("dtype") + "\"");
  }

  // The cuda_graph pass records the gradients stage, this pass's wrapper inside it. The
  // non-finite check stays on the device now, but no GPU has replayed it in a graph yet (fp16's
  // is refused by cuda_graph itself, from the compute dtype).
  std::string plan_problem(const Config& config, const PlanFacts& facts) const override {
    const auto& passes = facts.enabled_passes;
    if (config.get_bool("skip_if_nonfinite") && std::find(passes.begin(), passes.end(), "cuda_graph") != passes.end())
      return "pass 'amp': skip_if_nonfinite's non-finite check has not been run inside pass 'cuda_graph''s recorded step "
             "on a GPU yet; set skip_if_nonfinite = false";
    return {};
  }

  std::optional<c10::ScalarType> compute_dtype(const Config& config) const override {
    return config.get_string("dtype") == "fp16" ? at::kHalf : at::kBFloat16;
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    return unread_dtypes(config, facts) + cpu_products(config, facts);
  }

  // The dtypes amp hands the data-parallel passes are read only by them (fsdp's gathers; the
  // reductions of ddp, zero1, zero2 and fsdp): a plan without them says so, as a strategy that
  // switched fsdp off (a one-process baseline, a reshard) keeps them unread.
  static std::string unread_dtypes(const Config& config, const PlanFacts& facts) {
    const auto& passes = facts.enabled_passes;
    const auto enabled = [&passes](const char* name) { return std::find(passes.begin(), passes.end(), name) != passes.end(); };
    std::string out;
    if (config.get_string("gather_dtype") != "compute" && !enabled("fsdp"))
      out += "amp: gather_dtype = \"" + config.get_string("gather_dtype") + "\" is not read: it is the dtype fsdp gathers in, and fsdp is off\n";
    if (config.get_string("reduce_dtype") != "fp32" && !enabled("ddp") && !enabled("zero1") && !enabled("zero2") && !enabled("fsdp"))
      out += "amp: reduce_dtype = \"" + config.get_string("reduce_dtype") +
             "\" is not read: it is the dtype ddp, zero1, zero2 and fsdp reduce in, and they are off\n";
    return out;
  }

  // On a CPU without native half-precision products amp cannot be faster than fp32, which a user
  // choosing amp for speed needs to know before the run.
  static std::string cpu_products(const Config& config, const PlanFacts& facts) {
    if (facts.device != c10::DeviceType::CPU) return {};
    const bool fp16 = config.get_string("dtype") == "fp16";
    const bool native = fp16 ? cpu_has(CpuFeature::avx512_fp16) || cpu_has(CpuFeature::amx_fp16)
                             : cpu_has(CpuFeature::avx512_bf16) || cpu_has(CpuFeature::amx_bf16);
    if (native) return {};
    const std::string name = fp16 ? "FP16" : "BF16", dtype = config.get_string("dtype");
    return "amp: this CPU has neither AVX512-" + name + " nor AMX-" + name + ", so it has no native " + dtype + " products:\n" +
           "  not faster than fp32 here. Where ATen's oneDNN has no " + dtype + " GEMM either (an AVX2-only CPU), the kernels\n"
           "  plugin runs the GEMMs in fp32 on the widened operands (amp.toml's GPT on an AVX2-only EPYC: 0.20 s a step in\n"
           "  bf16, 0.23 s in fp16, 0.19 s in fp32; ATen's own GEMMs: 2.7 and 3.4 s; docs/performance.md).\n";
  }

  // Autocast saves 16-bit activations and keeps a 16-bit copy of the weights it casts in forward.
  void estimate(const Config&, const PlanFacts&, CostEstimate& c) const override {
    c.activation_bytes /= 2, c.activation_element_bytes = 2, c.transient_bytes += c.weight_bytes / 2;
  }

  void apply(Job& job, const Config& config) const override {
    const bool fp16 = config.get_string("dtype") == "fp16";
    const Settings settings{dtype_named(config.get_string("dtype")),
                            fp16,
                            fp16 || config.get_bool("skip_if_nonfinite"),
                            config.get_float("growth_factor"),
                            config.get_float("backoff_factor"),
                            config.get_int("growth_interval")};
    const c10::DeviceType device = job.device().type();
    auto scaler = std::make_shared<Scaler>(fp16 ? config.get_float("init_scale") : 1.0, job.device());
    job.register_state("amp", scaler);
    job.reduce_dtype = dtype_named(config.get_string("reduce_dtype"));
    if (config.get_string("gather_dtype") == "compute") job.gather_dtype = settings.dtype;

    // Autocast covers the forward and the loss; backward follows the dtypes autocast recorded.
    const StepHook autocast_on = [device, settings](StepContext&) {
      at::autocast::set_autocast_dtype(device, settings.dtype);
      at::autocast::set_autocast_enabled(device, true);
    };
    const StepHook autocast_off = [device](StepContext&) {
      at::autocast::set_autocast_enabled(device, false);
      at::autocast::clear_cache();
    };
    job.add_hook(HookPoint::BeforeForward, autocast_on);
    job.add_hook(HookPoint::AfterForward, autocast_off);
    job.add_hook(HookPoint::BeforeEvaluate, autocast_on);
    job.add_hook(HookPoint::AfterEvaluate, autocast_off);
    if (config.get_bool("precast_weights")) install_weight_precast(job, settings.dtype);

    // Backward runs on the scaled loss; each computation of the gradients is then unscaled and
    // checked before anything (clipping, WSAM) reads them, and the update is skipped on the
    // device where the check failed.
    if (settings.scaling) job.program.set_device_loss_scale(scaler->scale);
    if (settings.check_nonfinite) {
      job.program.add_skip_flag(scaler->found_nonfinite);
      job.program.wrap(Stage::Gradients, [&job, scaler](StepContext& context, const StageFn& inner) {
        if (scaler->step != context.step) scaler->step = context.step, scaler->found_nonfinite.zero_();
        inner(context);
        unscale_and_check(job, *scaler);
      });
    }
    // Once per step, after the update; the figures stay on the device until a step records them.
    // Without the check (bf16's default) nothing changes: no kernel runs.
    job.add_hook(HookPoint::AfterStep, [&job, scaler, settings](StepContext& context) {
      if (!settings.check_nonfinite) {
        context.metrics.emplace_back("amp_skipped", 0.0);
        job.program.report_device_figure("amp_skipped_steps", scaler->skipped_steps);  // constant in this run
        return;
      }
      if (settings.scaling) job.program.report_device_figure("amp_loss_scale", scaler->scale.clone());
      job.program.report_device_figure("amp_skipped", scaler->found_nonfinite.clone());
      update_scale(*scaler, settings);
      job.program.report_device_figure("amp_skipped_steps", scaler->skipped_steps.clone());
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<AmpPass>()); }

}  // namespace
}  // namespace strata::amp

STRATA_PLUGIN("amp", "0.2.0", strata::amp::register_components)
