// Automatic mixed precision: the forward (and loss) runs under libtorch's autocast in fp16 or
// bf16 while parameters, gradients and optimizer state stay fp32 (the master weights). fp16
// gradients are protected by a dynamic loss scaler: backward runs on loss x scale, gradients are
// unscaled before clipping, a step with any non-finite gradient is skipped and the scale backs
// off, and after growth_interval clean steps it grows. bf16 needs no scaling; it can skip
// non-finite steps on request. The gradient-sync pass reduces gradients in reduce_dtype, and
// fsdp gathers full parameters in the compute dtype (gather_dtype) so that only the shards it
// keeps for the optimizer are fp32. Evaluation runs under the same autocast. precast_weights
// casts each block's Linear parameters together (weight_precast.h).
#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "strata/cpu.h"
#include "strata/plugin.h"
#include "weight_precast.h"

namespace strata::amp {
namespace {

// The scaler's state, checkpointed as amp/scale, amp/growth_tracker, amp/skipped_steps.
class Scaler final : public Stateful {
 public:
  explicit Scaler(double init_scale) : scale(init_scale) {}

  NamedTensors save() const override {
    return {{"scale", at::tensor(scale, at::kDouble)},
            {"growth_tracker", at::tensor(growth_tracker, at::kLong)},
            {"skipped_steps", at::tensor(skipped_steps, at::kLong)}};
  }

  // Every data rank takes the same skip and scale decisions (the non-finite check is reduced).
  bool same_on_data_ranks() const override { return true; }

  void load(const NamedTensors& tensors) override {
    for (const auto& [name, t] : tensors) {
      if (name == "scale") scale = t.item<double>();
      else if (name == "growth_tracker") growth_tracker = t.item<int64_t>();
      else if (name == "skipped_steps") skipped_steps = t.item<int64_t>();
    }
  }

  double scale;
  int64_t growth_tracker = 0;
  int64_t skipped_steps = 0;
  // Within one step (not saved): the step, the scale its backward passes used, and whether any
  // of them had a non-finite gradient. A pass that runs the gradients twice (WSAM) calls the
  // wrapper twice; the scale still updates once per step.
  int64_t step = -1;
  double step_scale = 1.0;
  bool found_nonfinite = false;
};

struct Settings {
  at::ScalarType dtype;
  bool scaling;  // fp16
  bool check_nonfinite;
  double growth_factor, backoff_factor;
  int64_t growth_interval;
};

// Unscales the gradients in place and tells whether any of them, on any data-parallel rank, is
// not finite (every rank must take the same decision).
bool unscale_and_check(const Job& job, double inv_scale) {
  at::NoGradGuard no_grad;
  at::Tensor bad = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(job.device()));
  for (auto& [g, placement] : job.local_gradients()) {
    if (!g.defined()) continue;
    if (inv_scale != 1.0) g.mul_(inv_scale);
    bad.add_(at::logical_not(at::isfinite(g)).any().to(at::kFloat));
  }
  job.topology->group(Dim::Data).all_reduce(bad, ReduceOp::Max)->wait();
  return bad.item<float>() > 0;
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
  }

  // The cuda_graph pass records the gradients stage, this pass's wrapper inside it; the
  // non-finite check reads its result on the host there, which a recording cannot (fp16's is
  // refused by cuda_graph itself, from the compute dtype).
  std::string plan_problem(const Config& config, const PlanFacts& facts) const override {
    const auto& passes = facts.enabled_passes;
    if (config.get_bool("skip_if_nonfinite") && std::find(passes.begin(), passes.end(), "cuda_graph") != passes.end())
      return "pass 'amp': skip_if_nonfinite reads the gradients' non-finite check on the host in every step, which pass "
             "'cuda_graph' cannot record; set skip_if_nonfinite = false";
    return {};
  }

  std::optional<c10::ScalarType> compute_dtype(const Config& config) const override {
    return config.get_string("dtype") == "fp16" ? at::kHalf : at::kBFloat16;
  }

  // On a CPU without native half-precision products amp cannot be faster than fp32, which a user
  // choosing amp for speed needs to know before the run.
  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
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
    auto scaler = std::make_shared<Scaler>(fp16 ? config.get_float("init_scale") : 1.0);
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

    // Each computation of the gradients: backward on the scaled loss, then gradients unscaled
    // and checked before anything (clipping, WSAM) reads them.
    job.program.wrap(Stage::Gradients, [&job, scaler, settings](StepContext& context, const StageFn& inner) {
      if (scaler->step != context.step) scaler->step = context.step, scaler->step_scale = scaler->scale, scaler->found_nonfinite = false;
      const double scale = scaler->step_scale;
      context.loss_scale = scale;
      inner(context);
      context.loss_scale = 1.0;
      if (settings.check_nonfinite && unscale_and_check(job, 1.0 / scale)) scaler->found_nonfinite = true;
      if (scaler->found_nonfinite) context.skip_step = true;
    });
    // Once per step: the scale backs off after a non-finite step and grows after clean ones.
    job.add_hook(HookPoint::AfterStep, [scaler, settings](StepContext& context) {
      const bool skipped = scaler->found_nonfinite;
      const double scale = scaler->step_scale;
      if (skipped) {
        ++scaler->skipped_steps;
        if (settings.scaling) scaler->scale = scale * settings.backoff_factor, scaler->growth_tracker = 0;
      } else if (settings.scaling && ++scaler->growth_tracker == settings.growth_interval) {
        scaler->scale = scale * settings.growth_factor;
        scaler->growth_tracker = 0;
      }
      if (settings.scaling) context.metrics.emplace_back("amp_loss_scale", scale);
      context.metrics.emplace_back("amp_skipped", skipped ? 1.0 : 0.0);
      context.metrics.emplace_back("amp_skipped_steps", static_cast<double>(scaler->skipped_steps));
    });
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<AmpPass>()); }

}  // namespace
}  // namespace strata::amp

STRATA_PLUGIN("amp", "0.2.0", strata::amp::register_components)
