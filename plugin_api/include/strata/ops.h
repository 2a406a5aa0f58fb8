// The operator ABI: named operators with fixed signatures. Layers call these functions; each
// dispatches to the highest-priority registered implementation that supports the call and falls
// back to core's reference implementation (ATen composite, autograd-correct, any device).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/component.h"

namespace strata::ops {

// Each operator: its name and the function type an implementation provides.
struct Attention {  // q, k, v: [B, H, T, D] (k/v may have fewer heads: grouped-query); -> [B, H, T, D]
  static constexpr const char* name = "attention";
  using Fn = at::Tensor (*)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                            const std::optional<at::Tensor>& additive_mask);
};
struct LayerNorm {
  static constexpr const char* name = "layer_norm";
  using Fn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double eps);
};
struct RmsNorm {
  static constexpr const char* name = "rms_norm";
  using Fn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& weight, double eps);
};
struct Linear {
  static constexpr const char* name = "linear";
  using Fn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
};
struct Gelu {  // tanh approximation, as GPT-2
  static constexpr const char* name = "gelu";
  using Fn = at::Tensor (*)(const at::Tensor& x);
};
struct SwiGlu {  // silu(gate) * up
  static constexpr const char* name = "swiglu";
  using Fn = at::Tensor (*)(const at::Tensor& gate, const at::Tensor& up);
};
struct Rope {  // x: [B, H, T, D], cos/sin: [T, D/2]; rotate-half layout (Hugging Face Llama)
  static constexpr const char* name = "rope";
  using Fn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
};
struct CrossEntropy {  // logits [N, V], targets [N] int64 -> mean loss (fp32)
  static constexpr const char* name = "cross_entropy";
  using Fn = at::Tensor (*)(const at::Tensor& logits, const at::Tensor& targets);
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
  using Fn = void (*)(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                      const AgdHyper& hyper);
};

STRATA_API at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                const std::optional<at::Tensor>& additive_mask = std::nullopt);
STRATA_API at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 double eps);
STRATA_API at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
STRATA_API at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
STRATA_API at::Tensor gelu(const at::Tensor& x);
STRATA_API at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
STRATA_API at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
STRATA_API at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets);
STRATA_API void agd_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                           const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                           const AgdHyper& hyper);

// Where an implementation applies. Empty lists mean "any".
struct Support {
  std::vector<c10::DeviceType> devices;
  std::vector<c10::ScalarType> dtypes;
  bool accepts(const at::Tensor& probe) const;
};

// Base of operator implementations; register OperatorImpl<Op> instances, never this directly.
class STRATA_API OperatorImplBase : public Component {
 public:
  ~OperatorImplBase() override;
  const std::string& op() const { return op_; }
  int priority() const { return priority_; }
  const Support& support() const { return support_; }

 protected:
  OperatorImplBase(std::string impl_name, std::string summary, std::string op, Support support, int priority);

 private:
  std::string op_;
  Support support_;
  int priority_;
};

// An implementation of operator Op. Core's references have priority 0; a faster
// implementation registers a higher priority for the devices and dtypes it handles.
template <class Op>
class OperatorImpl final : public OperatorImplBase {
 public:
  OperatorImpl(std::string impl_name, std::string summary, typename Op::Fn fn, Support support = {}, int priority = 10)
      : OperatorImplBase(std::move(impl_name), std::move(summary), Op::name, std::move(support), priority), fn_(fn) {}
  typename Op::Fn fn() const { return fn_; }

 private:
  typename Op::Fn fn_;
};

}  // namespace strata::ops
