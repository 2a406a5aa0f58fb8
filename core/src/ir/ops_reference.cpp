// Reference implementations of every operator: ATen compositions, autograd-correct, any device.
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "strata/core/operator_table.h"

namespace strata {

namespace ops {

at::Tensor visible_pairs(const AttentionMask& mask, int64_t tq, int64_t tk, const at::Device& device) {
  at::Tensor visible;
  if (mask.causal) {
    const auto index = at::TensorOptions().dtype(at::kLong).device(device);
    const at::Tensor qi = mask.q_index.defined() ? mask.q_index.to(device) : at::arange(tk - tq, tk, index);
    const at::Tensor ki = mask.kv_index.defined() ? mask.kv_index.to(device) : at::arange(tk, index);
    visible = ki.unsqueeze(0).le(qi.unsqueeze(1)).view({1, 1, tq, tk});
    if (mask.sliding_window > 0)  // and no more than sliding_window - 1 positions back
      visible = visible.logical_and(ki.unsqueeze(0).gt(qi.unsqueeze(1) - mask.sliding_window).view({1, 1, tq, tk}));
  }
  if (mask.q_document.defined() != mask.kv_document.defined())
    throw std::invalid_argument("attention: a document mask needs the documents of both queries and keys");
  if (mask.q_document.defined()) {
    const at::Tensor same = mask.q_document.to(device).unsqueeze(2).eq(mask.kv_document.to(device).unsqueeze(1)).unsqueeze(1);  // [B, 1, Tq, Tk]
    visible = visible.defined() ? visible.logical_and(same) : same;
  }
  return visible;
}

}  // namespace ops

namespace {

// Scores in at least fp32, softmax written out so that the log-sum-exp is a differentiable output. A
// query that sees no key gets a zero row and lse -inf, with zero (not NaN) gradients.
ops::AttentionResult attention_with_lse(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& visible, const std::optional<at::Tensor>& additive) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const at::ScalarType compute = at::promote_types(q.scalar_type(), at::kFloat);
  at::Tensor scores = at::matmul(q.to(compute), key.to(compute).transpose(-2, -1)) * scale;
  if (additive) scores = scores + additive->to(compute);
  const double inf = std::numeric_limits<double>::infinity();
  if (visible.defined()) scores = scores.masked_fill(visible.logical_not(), -inf);
  const at::Tensor row_max = std::get<0>(scores.detach().max(-1, /*keepdim=*/true));
  const at::Tensor shift = at::where(row_max.isfinite(), row_max, at::zeros_like(row_max));
  const at::Tensor e = at::exp(scores - shift);
  const at::Tensor sum = e.sum(-1, /*keepdim=*/true);
  const at::Tensor empty = sum.eq(0);
  const at::Tensor safe_sum = at::where(empty, at::ones_like(sum), sum);
  at::Tensor out = at::matmul(e / safe_sum, value.to(compute)).to(q.scalar_type());
  at::Tensor lse = at::where(empty, at::full_like(sum, -inf), at::log(safe_sum) + shift).squeeze(-1);
  return {out, lse};
}

ops::AttentionResult attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& mask,
                                         bool with_lse) {
  if (mask.sliding_window < 0 || (mask.sliding_window > 0 && !mask.causal))
    throw std::invalid_argument("attention: sliding_window " + std::to_string(mask.sliding_window) +
                                " needs a causal mask and a positive size (0: none)");
  // Grouped-query attention: each key/value head serves heads(q) / heads(k) query heads.
  at::Tensor key = k, value = v;
  if (k.size(1) != q.size(1)) {
    const int64_t repeat = q.size(1) / k.size(1);
    key = k.repeat_interleave(repeat, 1);
    value = v.repeat_interleave(repeat, 1);
  }
  const int64_t tq = q.size(2), tk = key.size(2);
  const bool plain_causal = mask.causal && mask.sliding_window == 0 && !mask.q_index.defined() && !mask.kv_index.defined() && tq == tk;
  if (with_lse) return attention_with_lse(q, key, value, ops::visible_pairs(mask, tq, tk, q.device()), mask.additive);
  // ATen's fused kernels where the mask is theirs: none, or causal over the same tokens.
  if (!mask.q_document.defined() && !mask.additive && (!mask.causal || plain_causal))
    return {at::scaled_dot_product_attention(q, key, value, std::nullopt, 0.0, mask.causal), {}};
  at::Tensor visible = ops::visible_pairs(mask, tq, tk, q.device());
  std::optional<at::Tensor> attn_mask;
  if (mask.additive) {
    attn_mask = visible.defined() ? mask.additive->masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity())
                                  : *mask.additive;
  } else {
    attn_mask = visible;
  }
  return {at::scaled_dot_product_attention(q, key, value, attn_mask, 0.0, false), {}};
}

// The formulas of ops.h, written out in at least fp32 with [Tq, Tk] scores.
ops::AttentionGradients attention_backward_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                     const at::Tensor& lse, const at::Tensor& d_out, const ops::AttentionMask& mask) {
  if (mask.additive) throw std::invalid_argument("attention_backward: an additive mask is not supported");
  const at::ScalarType compute = at::promote_types(q.scalar_type(), at::kFloat);
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor key = (group > 1 ? k.repeat_interleave(group, 1) : k).to(compute);
  const at::Tensor value = (group > 1 ? v.repeat_interleave(group, 1) : v).to(compute);
  const at::Tensor query = q.to(compute), dout = d_out.to(compute), whole_lse = lse.to(compute).unsqueeze(-1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor p = at::exp(at::matmul(query, key.transpose(-2, -1)) * scale - whole_lse);
  const at::Tensor visible = ops::visible_pairs(mask, q.size(2), key.size(2), q.device());
  p = at::where(whole_lse.isneginf(), at::zeros_like(p), p);
  if (visible.defined()) p = p.masked_fill(visible.logical_not(), 0.0);
  const at::Tensor delta = (dout * out.to(compute)).sum(-1, /*keepdim=*/true);
  const at::Tensor ds = p * (at::matmul(dout, value.transpose(-2, -1)) - delta) * scale;
  at::Tensor dk = at::matmul(ds.transpose(-2, -1), query), dv = at::matmul(p.transpose(-2, -1), dout);
  if (group > 1) {  // sum each kv head's query heads
    dk = dk.unflatten(1, {k.size(1), group}).sum(2);
    dv = dv.unflatten(1, {v.size(1), group}).sum(2);
  }
  return {at::matmul(ds, key).to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

at::Tensor layer_norm_reference(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                double eps) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // In at least fp32 whatever the input dtype, as Hugging Face's LlamaRMSNorm does.
  at::Tensor x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

// The add, then the norm operator (whatever serves it in this block).
ops::AddNormResult add_layer_norm_reference(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias, double eps) {
  at::Tensor sum = residual + x;
  return {sum, ops::layer_norm(sum, weight, bias, eps)};
}

ops::AddNormResult add_rms_norm_reference(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor sum = residual + x;
  return {sum, ops::rms_norm(sum, weight, eps)};
}

at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return at::linear(x, weight, bias);
}

at::Tensor gelu_reference(const at::Tensor& x) { return at::gelu(x, "tanh"); }

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor grouped_mm_reference(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef group_sizes) {
  if (x.dim() != 2 || weight.dim() != 3 || weight.size(0) != static_cast<int64_t>(group_sizes.size()) || x.size(1) != weight.size(2))
    throw std::invalid_argument("grouped_mm: x [M, in] and weight [G, out, in] with G group sizes, not " + c10::str(x.sizes()) + ", " +
                                c10::str(weight.sizes()) + " and " + std::to_string(group_sizes.size()) + " sizes");
  // Groups of one size (an MoE layer's experts padded to their capacity): one batched product.
  const int64_t groups = weight.size(0);
  if (groups > 0 && group_sizes[0] > 0 && std::all_of(group_sizes.begin(), group_sizes.end(), [&](int64_t n) { return n == group_sizes[0]; }))
    return at::bmm(x.reshape({groups, group_sizes[0], x.size(1)}), weight.transpose(1, 2)).reshape({x.size(0), weight.size(1)});
  // split and cat differentiate into cat and split: one copy of x's and y's gradients, not one
  // zero-filled full-size gradient per group as narrow's backward would make.
  const std::vector<at::Tensor> rows = x.split_with_sizes(group_sizes);
  const std::vector<at::Tensor> weights = weight.unbind(0);
  std::vector<at::Tensor> out;
  out.reserve(rows.size());
  for (size_t g = 0; g < rows.size(); ++g) out.push_back(at::matmul(rows[g], weights[g].t()));
  return at::cat(out, 0);
}

at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  at::Tensor c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

at::Tensor cross_entropy_reference(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.to(at::kFloat), targets);
}

// The logits written out: what the fused implementations must equal.
at::Tensor linear_cross_entropy_reference(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                          const at::Tensor& targets) {
  return at::cross_entropy_loss(at::linear(hidden, weight, bias).to(at::kFloat), targets);
}

// torch.optim.AdamW's single-tensor update, one ATen operation per line, parameter after
// parameter (what the optimizers plugin ran before the operator existed).
void adamw_update_reference(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                            const ops::AdamwHyper& h) {
  at::NoGradGuard no_grad;
  const double t = static_cast<double>(h.step);
  const double bias1 = 1.0 - std::pow(h.beta1, t), bias2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, t));
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor &param = params[i], &grad = grads[i], &exp_avg = exp_avgs[i], &exp_avg_sq = exp_avg_sqs[i];
    if (h.weight_decay != 0) param.mul_(1.0 - h.lr * h.weight_decay);
    exp_avg.lerp_(grad, 1.0 - h.beta1);
    exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1.0 - h.beta2);
    at::Tensor denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(h.eps);
    param.addcdiv_(exp_avg, denom, -h.lr / bias1);
  }
}

// Written step for step from the formulas, one ATen operation each; the fused implementations
// are tested against it.
void agd_update_reference(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_diff_sq, const at::Tensor& max_exp_avg_diff_sq, const at::Tensor& z,
                          const ops::AgdHyper& h) {
  at::NoGradGuard no_grad;
  const double t = static_cast<double>(h.step);
  const double c1 = 1.0 - std::pow(h.beta1, t), c1_prev = 1.0 - std::pow(h.beta1, t - 1), c2 = 1.0 - std::pow(h.beta2, t);
  at::Tensor g = grad;
  if (!h.win && h.weight_decay != 0) {
    if (h.weight_decouple)
      param.mul_(1.0 - (h.fixed_decay ? 1.0 : h.lr) * h.weight_decay);
    else
      g = grad + h.weight_decay * param;
  }
  at::Tensor m_prev = exp_avg.clone();
  exp_avg.mul_(h.beta1).add_(g, 1.0 - h.beta1);
  at::Tensor s = exp_avg * (1.0 / c1);
  if (h.step > 1) s.sub_(m_prev * (1.0 / c1_prev));
  exp_avg_diff_sq.mul_(h.beta2).addcmul_(s, s, 1.0 - h.beta2);
  at::Tensor b = exp_avg_diff_sq;
  if (h.amsgrad) {
    at::Tensor running_max = max_exp_avg_diff_sq;
    at::maximum_out(running_max, running_max, exp_avg_diff_sq);
    b = max_exp_avg_diff_sq;
  }
  at::Tensor u = exp_avg / b.sqrt().clamp_min_(h.delta * std::sqrt(c2));
  if (h.clip > 0) u.clamp_(-h.clip, h.clip);
  const double a = h.lr * std::sqrt(c2) / c1;
  if (!h.win) {
    param.sub_(u, a);
    return;
  }
  z.sub_(u, a).div_(1.0 + h.weight_decay * a);
  const double tau = 1.0 / (3.0 + 2.0 * a * h.weight_decay);
  param.mul_(tau).sub_(u, 2.0 * tau * a).add_(z, 2.0 * tau);
}

template <class Op>
const ops::OperatorImplBase* reference(const char* summary, typename Op::Fn* fn) {
  static const ops::OperatorImpl<Op> impl(std::string(Op::name) + ".reference", summary, fn, {}, 0, /*defines=*/true);
  return &impl;
}

}  // namespace

OperatorTable::OperatorTable() { reset(); }

OperatorTable& OperatorTable::global() {
  static OperatorTable table;
  return table;
}

void OperatorTable::reset() {
  table_.clear();
  defined_by_.clear();
  pins_.clear();
  for (const auto* impl : {
           reference<ops::Attention>("scaled dot-product attention (ATen; written out in fp32 when the log-sum-exp is asked for), causal by window position, document and additive masks, GQA by repeat", attention_reference),
           reference<ops::AttentionBackward>("attention's gradients from its output and lse, written out in fp32 with [Tq, Tk] scores, GQA by repeat",
                                             attention_backward_reference),
           reference<ops::LayerNorm>("at::layer_norm", layer_norm_reference),
           reference<ops::RmsNorm>("RMSNorm computed in fp32", rms_norm_reference),
           reference<ops::AddLayerNorm>("residual + x, then the layer_norm operator", add_layer_norm_reference),
           reference<ops::AddRmsNorm>("residual + x, then the rms_norm operator", add_rms_norm_reference),
           reference<ops::Linear>("at::linear", linear_reference),
           reference<ops::Gelu>("GELU, tanh approximation", gelu_reference),
           reference<ops::SwiGlu>("silu(gate) * up", swiglu_reference),
           reference<ops::Rope>("rotary embedding, rotate-half layout", rope_reference),
           reference<ops::GroupedMm>("one at::matmul per group on its rows (split_with_sizes), results concatenated; groups of one size: one at::bmm",
                                     grouped_mm_reference),
           reference<ops::CrossEntropy>("mean cross entropy in fp32", cross_entropy_reference),
           reference<ops::LinearCrossEntropy>("at::linear, then mean cross entropy in fp32 (the [N, V] logits written out)",
                                              linear_cross_entropy_reference),
           reference<ops::AgdUpdate>("AGD step, one ATen operation per formula line", agd_update_reference),
           reference<ops::AdamwUpdate>("AdamW step, one ATen operation per formula line (torch.optim.AdamW's)",
                                       adamw_update_reference),
       }) {
    table_[impl->op()].push_back(impl);
    defined_by_[impl->op()] = "core";
  }
}

}  // namespace strata
