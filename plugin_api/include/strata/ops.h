// The operator ABI: named operators with fixed signatures. Layers call these functions; each
// dispatches to the implementation pinned for the running block, else to the highest-priority
// registered implementation that supports the call, and falls back to the operator's reference
// implementation (ATen composite, autograd-correct, any device).
//
// The set is open: a plugin defines a new operator with a struct like those below (a name and
// the function type `Fn` of its implementations) and registers its reference with
// `define_operator<Op>`; any plugin may then register more implementations of it, and code
// calls it with `call<Op>(probe, args...)`. An implementation is an object: it may keep state
// (fp8 scales per block) and receives the job before passes apply (`bind`) to reach its groups.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <typeinfo>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include "strata/component.h"

namespace strata {
class Job;
}

namespace strata::ops {

// Which keys each query may see. Token indices are positions in the whole training window: a
// rank under context parallel holds a permutation of some of them, and the mask follows the
// tokens, not their order. A query sees a key when (not causal, or kv_index <= q_index), both
// belong to the same document (packed data), and the additive mask allows it.
struct AttentionMask {
  bool causal = false;
  // [Tq] and [Tk] int64 window positions; undefined: the ends aligned, q 0..Tq-1 shifted to end
  // where kv 0..Tk-1 ends (a query block attending its prefix).
  at::Tensor q_index, kv_index;
  // Sliding window (with causal only; Mistral's, Longformer's local attention): a query at
  // position p sees keys at positions p - window + 1 .. p, its `window` most recent tokens,
  // itself included (positions as q_index/kv_index give them). 0: no limit.
  int64_t sliding_window = 0;
  // [B, Tq] and [B, Tk] int64 document ids; undefined: one document.
  at::Tensor q_document, kv_document;
  std::optional<at::Tensor> additive;  // broadcastable to [B, H, Tq, Tk]
};
// Which (query, key) pairs `mask` lets through by causality (window positions, the sliding
// window) and documents: [B or 1, 1, Tq, Tk] bool on `device`, undefined when every pair is
// visible; the additive mask is not in it. The reference builds its masks from it, as may an
// implementation that hands ATen a mask. Throws std::invalid_argument for documents of only one side.
STRATA_API at::Tensor visible_pairs(const AttentionMask& mask, int64_t tq, int64_t tk, const at::Device& device);

// out: [B, H, Tq, D]. lse: [B, H, Tq] (fp32, or fp64 for fp64 inputs), the log-sum-exp of each query's scaled scores over
// the keys it sees (-inf, with an output row of zeros, where it sees none), differentiable, so
// partial results over blocks of keys merge exactly (ring attention); undefined unless asked for.
struct AttentionResult {
  at::Tensor out, lse;
};

// Each operator: its name and the function type an implementation provides.
struct Attention {  // q, k, v: [B, H, T, D] (k/v may have fewer heads: grouped-query)
  static constexpr const char* name = "attention";
  using Fn = AttentionResult(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionMask& mask,
                             bool with_lse);
};
// The gradients of attention(q, k, v, mask) without autograd, given an output `out` [B, H, Tq, D],
// its log-sum-exp `lse` [B, H, Tq] and the output's gradient `d_out`:
//   P = exp(scale q k^T - lse) on the visible pairs (0 elsewhere, and on rows with lse = -inf),
//   dV = P^T dO,  dS = P (dO V^T - rowsum(dO o out)),  dQ = scale dS K,  dK = scale dS^T q,
// dK and dV summed over each kv head's query heads (grouped-query). `out` and `lse` may be those
// of a larger attention whose keys include these (ring attention's merged output, flash
// attention's backward per key block): the gradients are then this block's share of that
// attention's. No additive mask. Returns q's, k's and v's dtypes. ABI 1.9.
struct AttentionGradients {
  at::Tensor dq, dk, dv;
};
struct AttentionBackward {
  static constexpr const char* name = "attention_backward";
  using Fn = AttentionGradients(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                               const at::Tensor& lse, const at::Tensor& d_out, const AttentionMask& mask);
};
struct LayerNorm {
  static constexpr const char* name = "layer_norm";
  using Fn = at::Tensor(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps);
};
struct RmsNorm {
  static constexpr const char* name = "rms_norm";
  using Fn = at::Tensor(const at::Tensor& x, const at::Tensor& weight, double eps);
};
struct Linear {
  static constexpr const char* name = "linear";
  using Fn = at::Tensor(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
};
struct Gelu {  // tanh approximation, as GPT-2
  static constexpr const char* name = "gelu";
  using Fn = at::Tensor(const at::Tensor& x);
};
struct SwiGlu {  // silu(gate) * up
  static constexpr const char* name = "swiglu";
  using Fn = at::Tensor(const at::Tensor& gate, const at::Tensor& up);
};
struct Rope {  // x: [B, H, T, D], cos/sin: [T, D/2], or [B, 1, T, D/2] when positions differ per sequence; rotate-half layout
  static constexpr const char* name = "rope";
  using Fn = at::Tensor(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
};
// The experts of a mixture-of-experts layer in one call: x [M, in] holds the rows of group 0,
// then group 1, ... (tokens sorted by expert), group_sizes[g] rows each (summing to M, any of
// them 0); weight [G, out, in]. Row block g of the result [M, out] is x_g w_g^T: one GEMM per
// group on contiguous rows, never a gather per expert nor padding to a capacity.
struct GroupedMm {
  static constexpr const char* name = "grouped_mm";
  using Fn = at::Tensor(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef group_sizes);
};
struct CrossEntropy {  // logits [N, V], targets [N] int64 -> mean loss (fp32)
  static constexpr const char* name = "cross_entropy";
  using Fn = at::Tensor(const at::Tensor& logits, const at::Tensor& targets);
};
// The output projection and the loss in one: mean over rows of cross_entropy(hidden w^T + b) in
// fp32. hidden [N, D], weight [V, D], bias [V] or none, targets [N] int64 -> 0-dim fp32. An
// implementation may compute it without ever holding the [N, V] logits (the fused_loss pass).
struct LinearCrossEntropy {
  static constexpr const char* name = "linear_cross_entropy";
  using Fn = at::Tensor(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        const at::Tensor& targets);
};

// A pre-norm block's residual step in one call: sum = residual + x (ATen's type promotion: an
// fp32 residual stream plus autocast's bf16 branch output is fp32), and the norm of sum, exactly
// as the layer_norm / rms_norm operator computes it. One operator so that an implementation may
// fold the add into the norm's pass over each row, and backward the accumulation of sum's two
// gradients (the residual path's and the norm's) into the norm's backward: the unfused step runs
// an add kernel forward and an add (plus a cast for a 16-bit x) backward per residual. The
// references add, then call the norm operator (so a pinned norm still serves). ABI 1.5.
struct AddNormResult {
  at::Tensor sum, normed;
};
struct AddLayerNorm {
  static constexpr const char* name = "add_layer_norm";
  using Fn = AddNormResult(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, double eps);
};
struct AddRmsNorm {
  static constexpr const char* name = "add_rms_norm";
  using Fn = AddNormResult(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);
};

// Hyperparameters of one AGD update (docs/optimizers.md has the rule). clip <= 0: no clamp.
struct AgdHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, delta = 1e-5, weight_decay = 0.0, clip = 0.0;
  int64_t step = 1;  // t, counted from 1
  bool weight_decouple = true, fixed_decay = false, amsgrad = false, win = false;
};
// One AGD step of one parameter, in place. max_exp_avg_diff_sq is used with amsgrad and z with
// win; pass undefined tensors otherwise. All tensors have the parameter's shape and dtype.
struct AgdUpdate {
  static constexpr const char* name = "agd_update";
  using Fn = void(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                      const AgdHyper& hyper);
};

// Hyperparameters of one AdamW update (torch.optim.AdamW's rule, decoupled weight decay).
struct AdamwHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // t, counted from 1
};
// One AdamW step of a group of parameters (one device, one dtype, one set of hyperparameters), in
// place, each as: p *= 1 - lr wd; m = lerp(m, g, 1 - beta1); v = beta2 v + (1 - beta2) g^2;
// p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps). The i-th exp_avg and
// exp_avg_sq have the i-th parameter's shape and dtype. A group, not a tensor, so that a GPU
// implementation can update every parameter in a few multi-tensor launches.
struct AdamwUpdate {
  static constexpr const char* name = "adamw_update";
  using Fn = void(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                  const AdamwHyper& hyper);
};

STRATA_API AttentionResult attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionMask& mask,
                                     bool with_lse = false);
STRATA_API AttentionGradients attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                 const at::Tensor& lse, const at::Tensor& d_out, const AttentionMask& mask);
// The common case: causal or not, an optional additive mask, the output only.
STRATA_API at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                const std::optional<at::Tensor>& additive_mask = std::nullopt);
STRATA_API at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 double eps);
STRATA_API at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// Both pick the implementation by the residual (the stream's dtype).
STRATA_API AddNormResult add_layer_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                        const std::optional<at::Tensor>& bias, double eps);
STRATA_API AddNormResult add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);
STRATA_API at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
STRATA_API at::Tensor gelu(const at::Tensor& x);
STRATA_API at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
STRATA_API at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
STRATA_API at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef group_sizes);
STRATA_API at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets);
STRATA_API at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                           const at::Tensor& targets);
STRATA_API void agd_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                           const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                           const AgdHyper& hyper);
// Picked by the first parameter; an empty group does nothing.
STRATA_API void adamw_update(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                             const AdamwHyper& hyper);

// Where an implementation applies. Empty lists mean "any".
struct Support {
  std::vector<c10::DeviceType> devices;
  std::vector<c10::ScalarType> dtypes;
  STRATA_API bool accepts(const at::Tensor& probe) const;
  STRATA_API bool accepts(c10::DeviceType device, c10::ScalarType dtype) const;
  STRATA_API std::string str() const;  // "devices cpu/cuda, dtypes Float", "any" for an empty list
};

// Base of operator implementations; register OperatorImpl<Op> instances, never this directly.
class STRATA_API OperatorImplBase : public Component {
 public:
  ~OperatorImplBase() override;
  const std::string& op() const { return op_; }
  int priority() const { return priority_; }
  const Support& support() const { return support_; }
  // The reference implementation that defines operator op() (define_operator).
  bool defines_operator() const { return defines_; }
  // The operator's function type, as the compiler names it: every implementation of one
  // operator must have the definer's.
  const std::string& signature() const { return signature_; }
  // Called once per job, after the mesh and model exist and before passes apply. A stateful
  // implementation keeps what it needs (groups, per-block state) in members of its own.
  virtual void bind(Job& job) const;

 protected:
  OperatorImplBase(std::string impl_name, std::string summary, std::string op, Support support, int priority,
                   std::string signature, bool defines);

 private:
  std::string op_;
  Support support_;
  int priority_;
  std::string signature_;
  bool defines_;
};

// An implementation of operator Op. References have priority 0; a faster implementation
// registers a higher priority for the devices and dtypes it handles. One of priority 0 or less
// is opt-in: it serves only where a pin (module_replace) names it. `fn` may capture the
// implementation object (derive from this class to keep state).
template <class Op>
class OperatorImpl : public OperatorImplBase {
 public:
  OperatorImpl(std::string impl_name, std::string summary, std::function<typename Op::Fn> fn, Support support = {},
               int priority = 10, bool defines = false)
      : OperatorImplBase(std::move(impl_name), std::move(summary), Op::name, std::move(support), priority,
                         typeid(typename Op::Fn).name(), defines),
        fn_(std::move(fn)) {}
  const std::function<typename Op::Fn>& fn() const { return fn_; }

 protected:
  std::function<typename Op::Fn> fn_;
};

// The reference implementation that defines a new operator Op, named "<op>.reference".
template <class Op>
std::unique_ptr<OperatorImpl<Op>> define_operator(std::string summary, std::function<typename Op::Fn> reference) {
  return std::make_unique<OperatorImpl<Op>>(std::string(Op::name) + ".reference", std::move(summary), std::move(reference),
                                            Support{}, 0, /*defines=*/true);
}

// The implementation of `op` that serves a call whose representative tensor is `probe`, in the
// block running now: the one pinned there, else the best of priority > 0 that supports the probe,
// else the reference.
STRATA_API const OperatorImplBase& select(const std::string& op, const at::Tensor& probe);

// Every operator's name, and the implementations of `op`, highest priority first (the reference
// last). A UserError names an unknown operator. Plan-time checks (module_replace) read these.
STRATA_API std::vector<std::string> operator_names();
STRATA_API std::vector<const OperatorImplBase*> implementations(const std::string& op);

// Calls operator Op through the table.
template <class Op, class... Args>
decltype(auto) call(const at::Tensor& probe, Args&&... args) {
  // install() checks every implementation of Op::name has Op's signature, so the cast is exact.
  const auto& impl = static_cast<const OperatorImpl<Op>&>(select(Op::name, probe));
  // A profiler range named by the implementation ("attention.fused_cpu"): [job] profile_steps
  // and torch.profiler then show each operator call, its forward kernels included (work done
  // outside ATen's dispatched ops is otherwise lumped into "the rest"). Costs a thread-local
  // check when no profiler runs.
  RECORD_FUNCTION(impl.name().c_str(), std::vector<c10::IValue>());
  return impl.fn()(std::forward<Args>(args)...);
}

// Pins operator `op` to the implementation named `impl` in the blocks whose name or type is in
// `blocks` (empty: everywhere). The newest pin that matches a block wins. A UserError names an
// unknown operator or implementation; a call the pinned implementation does not support is a
// UserError too (never a silent fallback). Pins last until the table is reset (one job).
STRATA_API void pin(const std::string& op, const std::string& impl, const std::vector<std::string>& blocks = {});

// The block running now, set by nn::Model::forward around each block (its executor and hooks);
// operator pins and stateful implementations key on it. Empty strings outside any block.
class STRATA_API BlockScope {
 public:
  BlockScope(const std::string& name, const std::string& type);
  ~BlockScope();
  BlockScope(const BlockScope&) = delete;
  BlockScope& operator=(const BlockScope&) = delete;
  static const std::string& name();
  static const std::string& type();

 private:
  const std::string* previous_name_;
  const std::string* previous_type_;
};

}  // namespace strata::ops
