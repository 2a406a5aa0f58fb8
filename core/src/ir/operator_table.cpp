#include "strata/core/operator_table.h"

#include <algorithm>

#include "strata/errors.h"

namespace strata {

namespace ops {

bool Support::accepts(const at::Tensor& probe) const { return accepts(probe.device().type(), probe.scalar_type()); }

bool Support::accepts(c10::DeviceType device, c10::ScalarType dtype) const {
  auto has = [](const auto& list, auto value) {
    return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
  };
  return has(devices, device) && has(dtypes, dtype);
}

std::string Support::str() const {
  auto list = [](const auto& items, auto name) {
    if (items.empty()) return std::string("any");
    std::string s;
    for (const auto& i : items) {
      if (!s.empty()) s += "/";
      s += name(i);
    }
    return s;
  };
  return "devices " + list(devices, [](c10::DeviceType t) { return c10::DeviceTypeName(t, true); }) + ", dtypes " +
         list(dtypes, [](c10::ScalarType t) { return std::string(c10::toString(t)); });
}

OperatorImplBase::OperatorImplBase(std::string impl_name, std::string summary, std::string op, Support support, int priority,
                                   std::string signature, bool defines)
    : Component({ComponentKind::Operator, std::move(impl_name), std::move(summary), {}}),
      op_(std::move(op)),
      support_(std::move(support)),
      priority_(priority),
      signature_(std::move(signature)),
      defines_(defines) {}
OperatorImplBase::~OperatorImplBase() = default;
void OperatorImplBase::bind(Job&) const {}

namespace {
thread_local const std::string* current_block_name = nullptr;
thread_local const std::string* current_block_type = nullptr;
const std::string& or_empty(const std::string* s) {
  static const std::string empty;
  return s ? *s : empty;
}
}  // namespace

BlockScope::BlockScope(const std::string& name, const std::string& type)
    : previous_name_(current_block_name), previous_type_(current_block_type) {
  current_block_name = &name;
  current_block_type = &type;
}
BlockScope::~BlockScope() {
  current_block_name = previous_name_;
  current_block_type = previous_type_;
}
const std::string& BlockScope::name() { return or_empty(current_block_name); }
const std::string& BlockScope::type() { return or_empty(current_block_type); }

const OperatorImplBase& select(const std::string& op, const at::Tensor& probe) { return OperatorTable::global().select(op, probe); }
std::vector<std::string> operator_names() { return OperatorTable::global().operators(); }
std::vector<const OperatorImplBase*> implementations(const std::string& op) {
  const auto names = OperatorTable::global().operators();
  if (std::find(names.begin(), names.end(), op) == names.end())
    throw UserError("unknown operator '" + op + "' (see `strata ops`)");
  return OperatorTable::global().implementations(op);
}
void pin(const std::string& op, const std::string& impl, const std::vector<std::string>& blocks) {
  OperatorTable::global().pin(op, impl, blocks);
}

}  // namespace ops

void OperatorTable::install(const ComponentRegistry& registry) {
  auto plugin_name = [&](const Component* c) {
    const PluginRecord* plugin = registry.plugin_of(c);
    return plugin ? plugin->name : std::string("?");
  };
  // The table holds pointers into `registry`'s components: start from core's references only,
  // so nothing of a registry installed before (and perhaps destroyed since) is left behind.
  reset();
  const std::vector<const Component*> components = registry.components(ComponentKind::Operator);
  // Definitions first, so an implementation may come from a plugin loaded before the definer.
  for (const Component* c : components) {
    const auto* impl = static_cast<const ops::OperatorImplBase*>(c);
    if (!impl->defines_operator()) continue;
    auto it = table_.find(impl->op());
    if (it != table_.end()) {
      if (std::find(it->second.begin(), it->second.end(), impl) != it->second.end()) continue;  // installed before
      throw UserError("operator '" + impl->op() + "' is defined by plugin '" + plugin_name(c) + "' and by " +
                      defined_by_.at(impl->op()) + "; operator names must be unique");
    }
    table_[impl->op()] = {impl};
    defined_by_[impl->op()] = "plugin '" + plugin_name(c) + "'";
  }
  for (const Component* c : components) {
    const auto* impl = static_cast<const ops::OperatorImplBase*>(c);
    auto it = table_.find(impl->op());
    if (it == table_.end())
      throw UserError("operator implementation '" + c->name() + "' from plugin '" + plugin_name(c) + "' is for unknown operator '" +
                      impl->op() + "'");
    auto& impls = it->second;
    if (std::find(impls.begin(), impls.end(), impl) != impls.end()) continue;
    const auto definer = std::find_if(impls.begin(), impls.end(), [](auto* i) { return i->defines_operator(); });
    if (impl->signature() != (*definer)->signature())
      throw UserError("operator implementation '" + c->name() + "' from plugin '" + plugin_name(c) + "' has another function type than operator '" +
                      impl->op() + "' (defined by " + defined_by_.at(impl->op()) + "); rebuild it against the definer's header");
    impls.push_back(impl);
    // Highest priority first and the reference last (also below implementations of priority 0 or
    // less, which serve only where pinned).
    std::stable_sort(impls.begin(), impls.end(), [](auto* a, auto* b) {
      if (a->defines_operator() != b->defines_operator()) return b->defines_operator();
      return a->priority() > b->priority();
    });
  }
}

void OperatorTable::bind(Job& job) const {
  for (const auto& [op, impls] : table_)
    for (const auto* impl : impls) impl->bind(job);
}

void OperatorTable::pin(const std::string& op, const std::string& impl, const std::vector<std::string>& blocks) {
  auto it = table_.find(op);
  if (it == table_.end()) throw UserError("cannot pin unknown operator '" + op + "' (see `strata ops`)");
  for (const auto* candidate : it->second)
    if (candidate->name() == impl) {
      pins_.push_back({op, candidate, blocks});
      return;
    }
  std::string known;
  for (const auto* candidate : it->second) known += (known.empty() ? "" : ", ") + candidate->name();
  throw UserError("operator '" + op + "' has no implementation '" + impl + "' (implementations: " + known + ")");
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
  for (auto pin = pins_.rbegin(); pin != pins_.rend(); ++pin) {
    if (pin->op != op) continue;
    const std::string& name = ops::BlockScope::name();
    const bool here = pin->blocks.empty() || std::find_if(pin->blocks.begin(), pin->blocks.end(), [&](const std::string& b) {
                                               return b == name || b == ops::BlockScope::type();
                                             }) != pin->blocks.end();
    if (!here) continue;
    if (!pin->impl->support().accepts(probe))
      throw UserError("operator '" + op + "' is pinned to '" + pin->impl->name() + "'" + (name.empty() ? "" : " in block '" + name + "'") +
                      ", which does not support " + probe.device().str() + " " + c10::toString(probe.scalar_type()) + " tensors");
    return *pin->impl;
  }
  auto it = table_.find(op);
  if (it == table_.end()) throw std::logic_error("operator '" + op + "' is not in the table");
  for (const auto* impl : it->second)
    if ((impl->priority() > 0 || impl->defines_operator()) && impl->support().accepts(probe)) return *impl;
  return *it->second.back();  // the reference accepts everything
}

namespace ops {

// Each goes through call<Op> (ops.h), which picks the implementation and names the call for the
// profiler.
AttentionResult attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionMask& mask, bool with_lse) {
  return call<Attention>(q, q, k, v, mask, with_lse);
}
AttentionGradients attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                      const at::Tensor& lse, const at::Tensor& d_out, const AttentionMask& mask) {
  return call<AttentionBackward>(q, q, k, v, out, lse, d_out, mask);
}
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     const std::optional<at::Tensor>& additive_mask) {
  AttentionMask mask;
  mask.causal = causal;
  mask.additive = additive_mask;
  return call<Attention>(q, q, k, v, mask, false).out;
}
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps) {
  return call<LayerNorm>(x, x, weight, bias, eps);
}
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) { return call<RmsNorm>(x, x, weight, eps); }
AddNormResult add_layer_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, double eps) {
  return call<AddLayerNorm>(residual, residual, x, weight, bias, eps);
}
AddNormResult add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  return call<AddRmsNorm>(residual, residual, x, weight, eps);
}
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return call<Linear>(x, x, weight, bias);
}
at::Tensor gelu(const at::Tensor& x) { return call<Gelu>(x, x); }
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return call<SwiGlu>(gate, gate, up); }
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) { return call<Rope>(x, x, cos, sin); }
at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef group_sizes) {
  return call<GroupedMm>(x, x, weight, group_sizes);
}
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return call<CrossEntropy>(logits, logits, targets);
}
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                const at::Tensor& targets) {
  return call<LinearCrossEntropy>(hidden, hidden, weight, bias, targets);
}
void agd_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_diff_sq,
                const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z, const AgdHyper& hyper) {
  call<AgdUpdate>(param, param, grad, exp_avg, exp_avg_diff_sq, max_exp_avg_diff_sq, z, hyper);
}
void adamw_update(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                  const AdamwHyper& hyper) {
  TORCH_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size(),
              "adamw_update: ", params.size(), " parameters need as many gradients and moments");
  if (params.empty()) return;
  call<AdamwUpdate>(params.front(), params, grads, exp_avgs, exp_avg_sqs, hyper);
}

}  // namespace ops
}  // namespace strata
