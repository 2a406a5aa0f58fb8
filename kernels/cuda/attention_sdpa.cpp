// Attention on CUDA through ATen's fused kernels: no new CUDA code, the choice of kernel per mask.
//
// * Plain calls (no mask, or causal over the same tokens) without the log-sum-exp go to
//   at::scaled_dot_product_attention with is_causal and enable_gqa: ATen chooses flash-attention-2
//   (bf16/fp16), cuDNN or its memory-efficient kernel (fp32 too), grouped-query heads without
//   copying k/v where the chosen kernel allows.
//   In fp32, grouped-query k/v are repeated first (ATen's fp32 kernels have no GQA: its SDPA
//   would fall back to the unfused math path).
// * Causal calls over the same tokens with documents or a sliding window, without the
//   log-sum-exp (a Llama on packed text): ATen's SDPA with a boolean [B, 1, T, T] mask (1 byte per
//   pair), the reference's own call, measured 2-5x faster than the memory-efficient kernel with a
//   bias (bench/results/attention_cuda.md). Every query sees itself, so no row is empty.
// * Every other call (documents, a sliding window, window positions as context parallel permutes
//   them, an additive mask) and every call that asks for the log-sum-exp (context parallel's ring
//   merges blocks through it) goes to ATen's memory-efficient kernel
//   (_scaled_dot_product_efficient_attention, the xFormers/CUTLASS kernel) with the mask as an
//   additive bias of 0 / -inf. The bias is [B or 1, 1, Tq, Tk] in q's dtype, broadcast over heads
//   with stride 0 and padded to 16 keys (the kernel reads rows of 16); scores and probabilities
//   are never stored. Grouped-query k/v are repeated (this kernel has no GQA).
// * Its backward is ATen's, plus the log-sum-exp's gradient, which ATen's kernels do not take.
//   lse_i = log sum_j exp(s_ij) with s = scale q k^T, so d lse_i / d s_ij = P_ij and, with g the
//   incoming gradient of lse:
//       dq_i += scale g_i sum_j P_ij k_j = scale g_i attention(q, k, k)_i
//       dk_j += scale sum_i P_ij g_i q_i = the dv of ATen's backward for an output gradient g o q
//   One more forward and backward of the same kernel, only when lse has a gradient; exact.
// * A query that sees no key (its bias row all -inf) gets a zero row and lse -inf, as the
//   reference; its gradients are zero.
// * The kernel's backward reads its output and the output's gradient as [B, T, H, D] in memory
//   (the layout its forward writes): tensors passed back to it are laid out so (bmhk()); a
//   [B, H, T, D]-contiguous output there gives wrong dq/dk in bf16/fp16 (seen on an H200).
// * A learned additive mask (one that needs a gradient) goes to the reference (fp64 is not
//   registered: the table gives it the reference).
#include "cuda/attention_sdpa.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "strata/ops.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// 0 where a query sees a key, -inf elsewhere, plus the additive mask: [B or 1, 1 or H, Tq, Tk]
// in `dtype`, its rows stored 16 keys apart as the kernel reads them; undefined when every pair
// is visible and there is no additive mask.
at::Tensor attention_bias(const ops::AttentionMask& mask, int64_t tq, int64_t tk, at::ScalarType dtype,
                          const at::Device& device) {
  const at::Tensor visible = ops::visible_pairs(mask, tq, tk, device);  // the reference's own pairs
  if (!visible.defined() && !mask.additive) return {};
  at::Tensor bias = visible.defined()
                        ? at::zeros(visible.sizes(), at::TensorOptions().dtype(dtype).device(device))
                              .masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity())
                        : at::zeros({1, 1, tq, tk}, at::TensorOptions().dtype(dtype).device(device));
  if (mask.additive) bias = bias + mask.additive->to(device, dtype);
  while (bias.dim() < 4) bias = bias.unsqueeze(0);
  const int64_t padded = (tk + 15) / 16 * 16;
  at::Tensor storage = at::zeros({bias.size(0), bias.size(1), tq, padded}, bias.options());
  at::Tensor view = storage.narrow(3, 0, tk);
  view.copy_(bias.expand({bias.size(0), bias.size(1), tq, tk}));
  return view;
}

// The memory-efficient kernel with a differentiable lse; q, k, v with equal head counts.
// The bias travels outside the autograd inputs (it takes no gradient, and an input must be defined).
struct Bias {
  at::Tensor values;  // undefined: none
};

// [B, H, T, D] with the memory of [B, T, H, D], the layout the kernel writes its output in: its
// backward reads the output (and the output's gradient) assuming that layout.
at::Tensor bmhk(const at::Tensor& t) { return t.transpose(1, 2).contiguous().transpose(1, 2); }

struct EfficientAttention : public torch::autograd::Function<EfficientAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               Bias bias, bool causal) {
    const std::optional<at::Tensor> b =
        bias.values.defined() ? std::optional<at::Tensor>(bias.values.expand({q.size(0), q.size(1), q.size(2), k.size(2)})) : std::nullopt;
    auto [out, lse_padded, seed, offset] = at::_scaled_dot_product_efficient_attention(q, k, v, b, /*compute_log_sumexp=*/true, 0.0, causal);
    at::Tensor lse = lse_padded.narrow(2, 0, q.size(2));
    // Rows that see no key: the bias is -inf across them. Zero output, lse -inf, as the reference.
    at::Tensor empty;
    if (bias.values.defined()) {
      empty = bias.values.isneginf().all(-1);  // [B or 1, 1 or H, Tq]
      out = bmhk(at::where(empty.unsqueeze(-1), at::zeros({}, out.options()), out));
      lse = at::where(empty, -std::numeric_limits<double>::infinity(), lse);
    }
    ctx->save_for_backward({q, k, v, b ? *b : at::Tensor(), out, lse_padded, seed, offset, empty});
    ctx->saved_data["causal"] = causal;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &bias = saved[3], &out = saved[4], &lse = saved[5],
                     &seed = saved[6], &offset = saved[7], &empty = saved[8];
    const bool causal = ctx->saved_data["causal"].toBool();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const at::Tensor grad_out = grads[0].defined() ? bmhk(grads[0]) : at::zeros_like(out);
    auto [dq, dk, dv, dbias] = at::_scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, bias, out, lse, seed, offset, 0.0, {true, true, true, false}, causal);
    if (grads[1].defined()) {
      at::Tensor g = grads[1];  // [B, H, Tq]
      if (empty.defined()) g = at::where(empty, at::zeros({}, g.options()), g);
      g = g.unsqueeze(-1);
      const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
      at::Tensor pk = std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, k, b, false, 0.0, causal));  // P k
      if (empty.defined()) pk = at::where(empty.unsqueeze(-1), at::zeros({}, pk.options()), pk);
      dq = dq + (pk.to(at::kFloat) * g * scale).to(dq.scalar_type());
      const at::Tensor gq = bmhk((q.to(at::kFloat) * g).to(q.scalar_type()));
      const at::Tensor dk_from_lse = std::get<2>(at::_scaled_dot_product_efficient_attention_backward(
          gq, q, k, v, bias, out, lse, seed, offset, 0.0, {false, false, true, false}, causal));  // P^T (g o q)
      dk = dk + dk_from_lse * scale;
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

ops::AttentionResult reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& mask,
                               bool with_lse) {
  const auto* ref = ops::implementations(ops::Attention::name).back();  // always the reference
  return static_cast<const ops::OperatorImpl<ops::Attention>&>(*ref).fn()(q, k, v, mask, with_lse);
}

bool plain(const ops::AttentionMask& mask, int64_t tq, int64_t tk) {
  return !mask.q_document.defined() && !mask.additive && mask.sliding_window == 0 &&
         (!mask.causal || (!mask.q_index.defined() && !mask.kv_index.defined() && tq == tk));
}

// Causal over the same tokens in natural order, documents (if any) the same for queries and keys,
// no additive mask: every query sees at least itself, so no row is empty.
bool self_visible(const ops::AttentionMask& mask, int64_t tq, int64_t tk) {
  return mask.causal && !mask.additive && !mask.q_index.defined() && !mask.kv_index.defined() && tq == tk &&
         (!mask.q_document.defined() || mask.q_document.is_same(mask.kv_document));
}

}  // namespace

ops::AttentionResult attention_sdpa_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const ops::AttentionMask& mask, bool with_lse) {
  if (mask.sliding_window < 0 || (mask.sliding_window > 0 && !mask.causal))
    throw std::invalid_argument("attention: sliding_window " + std::to_string(mask.sliding_window) +
                                " needs a causal mask and a positive size (0: none)");
  if (mask.q_document.defined() != mask.kv_document.defined())
    throw std::invalid_argument("attention: a document mask needs the documents of both queries and keys");
  const int64_t tq = q.size(2), tk = k.size(2);
  if (q.scalar_type() == at::kDouble || (mask.additive && mask.additive->requires_grad()))
    return reference(q, k, v, mask, with_lse);
  // Grouped-query heads without copies where flash/cuDNN serve the call (bf16/fp16); in fp32
  // ATen's SDPA would fall back to its unfused math path for enable_gqa (16x the memory at 16k
  // tokens, bench/results/attention_cuda.md), so k/v are repeated as the reference does.
  const bool grouped = k.size(1) != q.size(1), native_gqa = grouped && q.scalar_type() != at::kFloat;
  if (!with_lse && plain(mask, tq, tk)) {
    if (grouped && !native_gqa) return reference(q, k, v, mask, false);
    return {at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, mask.causal, std::nullopt, native_gqa), {}};
  }
  // Documents (or a sliding window) over causal tokens, no lse: ATen's SDPA with a boolean mask,
  // 2-5x faster here than the memory-efficient kernel with a bias (cuDNN in bf16/fp16), exactly the
  // reference's call. Only where no row can be empty: ATen's kernels differ on rows that see no key.
  if (!with_lse && self_visible(mask, tq, tk)) return reference(q, k, v, mask, false);
  return attention_efficient_cuda(q, k, v, mask, with_lse);
}

ops::AttentionResult attention_efficient_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const ops::AttentionMask& mask, bool with_lse) {
  const int64_t tq = q.size(2), tk = k.size(2);
  at::Tensor key = k, value = v;
  if (k.size(1) != q.size(1)) {
    key = k.repeat_interleave(q.size(1) / k.size(1), 1);
    value = v.repeat_interleave(q.size(1) / k.size(1), 1);
  }
  // The kernel's own causal flag aligns the first query with the first key: use it only where
  // that is the mask (same tokens, natural order); otherwise the bias says who sees whom.
  const bool kernel_causal = mask.causal && plain(mask, tq, tk);
  const at::Tensor bias = kernel_causal ? at::Tensor() : attention_bias(mask, tq, tk, q.scalar_type(), q.device());
  const variable_list r = EfficientAttention::apply(q, key, value, Bias{bias}, kernel_causal);
  return {r[0], with_lse ? r[1] : at::Tensor()};
}

}  // namespace strata::kernels
