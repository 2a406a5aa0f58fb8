#include "strata/core/operator_table.h"

#include <algorithm>

#include "strata/errors.h"

namespace strata {

namespace ops {

bool Support::accepts(const at::Tensor& probe) const {
  auto has = [](const auto& list, auto value) {
    return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
  };
  return has(devices, probe.device().type()) && has(dtypes, probe.scalar_type());
}

OperatorImplBase::OperatorImplBase(std::string impl_name, std::string summary, std::string op, Support support, int priority)
    : Component({ComponentKind::Operator, std::move(impl_name), std::move(summary), {}}),
      op_(std::move(op)),
      support_(std::move(support)),
      priority_(priority) {}
OperatorImplBase::~OperatorImplBase() = default;

}  // namespace ops

void OperatorTable::install(const ComponentRegistry& registry) {
  for (const Component* c : registry.components(ComponentKind::Operator)) {
    const auto* impl = static_cast<const ops::OperatorImplBase*>(c);
    auto it = table_.find(impl->op());
    if (it == table_.end()) {
      const PluginRecord* plugin = registry.plugin_of(c);
      throw UserError("operator implementation '" + c->name() + "' from plugin '" + (plugin ? plugin->name : "?") +
                      "' is for unknown operator '" + impl->op() + "'");
    }
    auto& impls = it->second;
    if (std::find(impls.begin(), impls.end(), impl) != impls.end()) continue;
    impls.push_back(impl);
    std::stable_sort(impls.begin(), impls.end(), [](auto* a, auto* b) { return a->priority() > b->priority(); });
  }
}

const std::vector<const ops::OperatorImplBase*>& OperatorTable::implementations(const std::string& op) const {
  return table_.at(op);
}

std::vector<std::string> OperatorTable::operators() const {
  std::vector<std::string> out;
  for (const auto& [name, impls] : table_) out.push_back(name);
  return out;
}

const ops::OperatorImplBase& OperatorTable::select(const std::string& op, const at::Tensor& probe) const {
  for (const auto* impl : table_.at(op))
    if (impl->support().accepts(probe)) return *impl;
  return *table_.at(op).back();  // the reference accepts everything
}

namespace ops {

namespace {
// The implementation of Op chosen for a call, given a representative tensor.
template <class Op>
typename Op::Fn pick(const at::Tensor& probe) {
  // Only OperatorImpl<Op> carries Op::name, so the downcast matches the signature.
  return static_cast<const OperatorImpl<Op>&>(OperatorTable::global().select(Op::name, probe)).fn();
}
}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     const std::optional<at::Tensor>& additive_mask) {
  return pick<Attention>(q)(q, k, v, causal, additive_mask);
}
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps) {
  return pick<LayerNorm>(x)(x, weight, bias, eps);
}
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) { return pick<RmsNorm>(x)(x, weight, eps); }
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return pick<Linear>(x)(x, weight, bias);
}
at::Tensor gelu(const at::Tensor& x) { return pick<Gelu>(x)(x); }
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return pick<SwiGlu>(gate)(gate, up); }
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) { return pick<Rope>(x)(x, cos, sin); }
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return pick<CrossEntropy>(logits)(logits, targets);
}
void agd_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_diff_sq,
                const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z, const AgdHyper& hyper) {
  pick<AgdUpdate>(param)(param, grad, exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z, hyper);
}

}  // namespace ops
}  // namespace strata
