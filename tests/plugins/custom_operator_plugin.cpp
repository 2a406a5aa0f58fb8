// Test plugin: defines a new operator, "tagged_scale" (x * 2), with its reference and two more
// implementations, one of them stateful (it counts its calls per block and learns the data
// group's size from the job); a float32-only implementation of the core operator gelu; and a pass that pins an implementation from the strategy and
// calls the operator on every block's output, reporting which implementation served how often.
#include <atomic>
#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "strata/plugin.h"

namespace {

using namespace strata;

struct TaggedScale {
  static constexpr const char* name = "tagged_scale";
  using Fn = at::Tensor(const at::Tensor& x);
};

at::Tensor scale_by_two(const at::Tensor& x) { return x * 2; }

// Calls served, by implementation, since the last report.
std::map<std::string, int64_t>& served() {
  static std::map<std::string, int64_t> counts;
  return counts;
}

class CountingScale final : public ops::OperatorImpl<TaggedScale> {
 public:
  CountingScale()
      : OperatorImpl("tagged_scale.counting", "x * 2, counting calls per block (stateful)",
                     [this](const at::Tensor& x) { return run(x); }, {}, 5) {}
  void bind(Job& job) const override { data_ranks_ = job.topology->size(Dim::Data); }

 private:
  // Its own figures, next to the pass's: calls it ran, blocks it saw, the group size bind() gave.
  at::Tensor run(const at::Tensor& x) const {
    ++served()["counting_calls"];
    ++per_block_[ops::BlockScope::name()];
    served()["counting_blocks_seen"] = static_cast<int64_t>(per_block_.size());
    served()["counting_bound_data_ranks"] = data_ranks_;
    return x * 2;
  }
  mutable int data_ranks_ = 0;
  mutable std::map<std::string, int64_t> per_block_;
};

// A replacement for a core operator that declares float32 only (ATorch's replace pair registered
// for the dtypes it supports): module_replace may choose it for an fp32 job and must refuse it
// under amp bf16. It counts its calls, reported with the pass's figures.
at::Tensor counted_gelu(const at::Tensor& x) {
  ++served()["gelu.fp32_only"];
  return at::gelu(x, "tanh");
}

class PinOperator final : public Pass {
 public:
  PinOperator()
      : Pass({ComponentKind::Pass, "pin_operator", "Test only: pins an operator implementation and calls tagged_scale per block",
              Schema()
                  .required_string("operator", "Operator to pin")
                  .required_string("implementation", "Implementation to pin it to")
                  .strings("blocks", {}, "Block names or types the pin applies to; empty = all")},
             {Phase::ModelRewrite, {}, {}, {}, {}}) {}

  void apply(Job& job, const Config& config) const override {
    ops::pin(config.get_string("operator"), config.get_string("implementation"), config.get_strings("blocks"));
    for (size_t b = 0; b < job.model->num_blocks(); ++b)
      job.model->add_post_forward_hook(b, [](nn::Block&, const at::Tensor& out) {
        at::NoGradGuard no_grad;
        ++served()[ops::select(TaggedScale::name, out).name()];
        ops::call<TaggedScale>(out, out);  // the result is not used: which implementation ran is
      });
    job.add_hook(HookPoint::AfterStep, [](StepContext& context) {
      for (const auto& [impl, count] : served()) context.metrics.emplace_back("served." + impl, static_cast<double>(count));
      served().clear();
    });
  }
};

void register_components(Registry& registry) {
  registry.add(ops::define_operator<TaggedScale>("x * 2 (test operator)", &scale_by_two));
  registry.add(std::make_unique<ops::OperatorImpl<TaggedScale>>("tagged_scale.fast", "x * 2, highest priority", &scale_by_two,
                                                                ops::Support{}, 20));
  registry.add(std::make_unique<CountingScale>());
  registry.add(std::make_unique<ops::OperatorImpl<ops::Gelu>>("gelu.fp32_only", "tanh GELU, float32 only (test replacement)",
                                                              &counted_gelu, ops::Support{{}, {at::kFloat}}, 0));
  registry.add(std::make_unique<PinOperator>());
}

}  // namespace

STRATA_PLUGIN("custom_operator", "1.0.0", register_components)
