// A Linear layer whose GEMMs each go to the library that runs them faster on this CPU:
//   forward:      y  = x W^T + b     oneDNN's linear(x, W)
//   grad input:   dx = dy W          oneDNN's linear(dy, W^T), W^T a transposed view, no copy
//   grad weight:  dW = dy^T x        oneDNN's matmul(dy^T, x), dy^T a transposed view, no copy
//                                    (at::mm, i.e. MKL, where libtorch lacks it)
//   grad bias:    db = sum of dy's rows
// x is folded to [N, in] rows as at::linear folds it. The weight goes to oneDNN in its plain
// layout: packing it into oneDNN's blocked layout first (mkldnn::_reorder_linear_weight, what
// torch.compile's CPU backend does for frozen inference weights) made no GEMM faster and cost
// 1.2 ms per call at 512 x 2048, and training weights change every step. Saved for the
// backward: x's rows and W, what at::linear's autograd saves. oneDNN's linear is called through
// the dispatcher by its registered name (mkldnn::_linear_pointwise), boxed, so no private
// libtorch header is needed. Both libraries compute in fp32; results differ from at::linear's
// by summation order only (about 1e-6 relative).
//
// The weight gradient: oneDNN's *linear* wants both operands as [rows, reduction] and so needs
// copies of dy^T and x^T here (1.2-1.8x slower than MKL, bench/results/gemm_cpu.md); oneDNN's
// *matmul* reads the transposed view as it is and ran 0.87-0.97x MKL's time on 2 threads at the
// GPTs' shapes (0.96-1.0x on one). It has no registered op: at::native::mkldnn_matmul is
// exported by libtorch_cpu but its header is not in the wheel, so it is declared here, weak.
//
// Which CPU runs them: oneDNN's matmul refuses every call (fp32 too) unless the CPU has AVX-512
// BW/VL/DQ or AVX-NE-CONVERT (ATen's own callers check first; the check is ideep's and honours
// ONEDNN_MAX_CPU_ISA), so on an AVX2-only CPU the weight gradient is at::mm's (MKL). oneDNN's
// fp32 linear runs on any x86-64. Each is decided once, by the CPU's features and a trial call,
// and recorded with its reason (strata/cpu.h): `strata ops` shows it.
//
// bf16 and fp16 (the operands', or autocast's for a Linear): where ATen's oneDNN has a GEMM in that
// type (its own check: AVX-512 BW/VL/DQ, AVX-NE-CONVERT, AMX), at::linear runs it. Elsewhere, as on
// an AVX2-only CPU, ATen falls back to a scalar GEMM: a Linear's three GEMMs at 512 x 768 -> 3072
// took 32-39x the time of the same GEMMs in fp32 (bench/results/amp_cpu.md, one thread). There
// the three GEMMs run in fp32 on the operands widened
// exactly, and each result is rounded to the half type once: a bf16 or fp16 value is an fp32 value
// and so is the product of two (8- or 11-bit significands), so this is a half GEMM accumulating in
// fp32, as ATen's and oneDNN's are, up to the order of the sums. Saved for the backward in the
// half type, as a half Linear saves them; widened again there.
#include "linear_onednn.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "strata/cpu.h"

namespace at::native {
// result = alpha * mat1 mat2 + beta * result (ATen/native/mkldnn/Matmul.h in the torch sources).
__attribute__((weak)) void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result, float beta,
                                         float alpha);
}  // namespace at::native

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Looked up once; the mkldnn ops are registered when libtorch_cpu loads.
const std::optional<c10::OperatorHandle>& onednn_linear_op() {
  static const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op;
}

// rows [N, in] times weight [out, in] transposed (+ bias [out]): [N, out] through oneDNN.
at::Tensor onednn_rows_times_weight(const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& bias) {
  std::vector<c10::IValue> stack{rows, weight, bias.defined() ? c10::IValue(bias) : c10::IValue(), c10::IValue("none"),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string())};
  onednn_linear_op()->callBoxed(&stack);
  return stack.front().toTensor();
}

class OnednnLinear : public torch::autograd::Function<OnednnLinear> {
 public:
  // No bias is an empty tensor: autograd functions take defined tensors only.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
    const bool has_bias = bias.numel() > 0;
    ctx->save_for_backward({rows, weight});
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return onednn_rows_times_weight(rows, weight, has_bias ? bias : at::Tensor()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weight = saved[1];
    const at::Tensor dy = grads[0].reshape({-1, weight.size(0)}).contiguous();
    at::Tensor dx, dw, db;
    // The bias gradient first, while dy (just written by the op after this Linear) is still in
    // cache; after the two GEMMs it is read back from memory.
    if (ctx->needs_input_grad(2)) db = dy.sum(0);  // no bias: an empty tensor that needs no gradient
    if (ctx->needs_input_grad(0))
      dx = onednn_rows_times_weight(dy, weight.t(), at::Tensor()).view(ctx->saved_data["x_shape"].toIntVector());
    if (ctx->needs_input_grad(1)) dw = linear_weight_gradient(dy, rows);
    return {dx, dw, db};
  }
};

// rows [N, in] times weight [out, in] transposed (+ bias), fp32: oneDNN's linear where it serves,
// else at::linear. Called with autocast excluded.
at::Tensor fp32_rows_times_weight(const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& bias) {
  if (onednn_linear_chosen()) return onednn_rows_times_weight(rows, weight, bias);
  return at::linear(rows, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

at::Tensor widened(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

// A bf16 or fp16 Linear whose GEMMs run in fp32 (see the top of the file). x, weight and bias
// (empty for none) share the half type.
class HalfLinearViaFp32 : public torch::autograd::Function<HalfLinearViaFp32> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    ctx->save_for_backward({rows, weight});
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    const at::Tensor y = fp32_rows_times_weight(widened(rows), widened(weight), bias.numel() > 0 ? widened(bias) : at::Tensor());
    return y.to(x.scalar_type()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weight = saved[1];
    const at::ScalarType half = weight.scalar_type();
    const at::Tensor dy = widened(grads[0].reshape({-1, weight.size(0)}));
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(2)) db = dy.sum(0).to(half);
    if (ctx->needs_input_grad(0))
      dx = fp32_rows_times_weight(dy, widened(weight).t(), at::Tensor()).to(half).view(ctx->saved_data["x_shape"].toIntVector());
    if (ctx->needs_input_grad(1)) dw = linear_weight_gradient(dy, widened(rows)).to(half);
    return {dx, dw, db};
  }
};

}  // namespace

namespace {

// The first line of what a refused trial call said (ATen's messages carry a backtrace after it).
std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

CpuPathChoice decide_onednn_linear() {
  CpuPathChoice c{"onednn_linear", "Linear forward and input gradient (fp32)", "at::linear (MKL)", "", false};
  if (cpu_fallback_forced(c.path)) return c.why = "forced by STRATA_CPU_FALLBACK", c;
  if (!at::hasMKLDNN() || !onednn_linear_op()) return c.why = "this libtorch has no oneDNN linear", c;
  try {
    const at::Tensor y = onednn_rows_times_weight(at::ones({2, 3}), at::ones({4, 3}), at::Tensor());
    if (!at::equal(y, at::full({2, 4}, 3.0f))) return c.why = "oneDNN's linear gave a wrong result in a trial call", c;
  } catch (const std::exception& e) {
    return c.why = "oneDNN's linear refused a trial call: " + first_line(e), c;
  }
  c.chosen = "oneDNN linear", c.fast = true;
  c.why = "a trial call ran (oneDNN's fp32 kernels need no AVX-512)";
  return c;
}

CpuPathChoice decide_onednn_matmul() {
  CpuPathChoice c{"onednn_matmul", "Linear weight gradient (fp32)", "MKL (at::mm)", "", false};
  const bool avx512 = cpu_has(CpuFeature::avx512), avx_ne_convert = cpu_has(CpuFeature::avx_ne_convert);
  if (cpu_fallback_forced(c.path)) return c.why = "forced by STRATA_CPU_FALLBACK", c;
  if (!at::hasMKLDNN() || &at::native::mkldnn_matmul == nullptr) return c.why = "this libtorch does not export oneDNN's matmul", c;
  if (!avx512 && !avx_ne_convert)
    return c.why = "this CPU has no AVX-512 (BW, VL, DQ) and no AVX-NE-CONVERT, which oneDNN's matmul requires", c;
  try {
    const at::Tensor a = at::ones({3, 2}), b = at::ones({3, 4}), out = at::empty({2, 4});
    at::native::mkldnn_matmul(a.t(), b, out, /*beta=*/0.f, /*alpha=*/1.f);
    if (!at::equal(out, at::full({2, 4}, 3.0f))) return c.why = "oneDNN's matmul gave a wrong result in a trial call", c;
  } catch (const std::exception& e) {
    return c.why = "oneDNN's matmul refused a trial call: " + first_line(e), c;
  }
  c.chosen = "oneDNN matmul on transposed views", c.fast = true;
  c.why = avx512 ? "this CPU has AVX-512 (BW, VL, DQ)" : "this CPU has AVX-NE-CONVERT";
  return c;
}

// ATen's own answer to "does oneDNN run GEMMs in this type here" (what its CPU GEMM checks).
bool aten_has_half_gemm(at::ScalarType half) {
  const auto op = c10::Dispatcher::singleton().findSchema(
      {half == at::kBFloat16 ? "mkldnn::_is_mkldnn_bf16_supported" : "mkldnn::_is_mkldnn_fp16_supported", ""});
  if (!op) return false;
  std::vector<c10::IValue> stack;
  op->callBoxed(&stack);
  return stack.front().toBool();
}

CpuPathChoice decide_half_gemms(at::ScalarType half) {
  const std::string type = half == at::kBFloat16 ? "bf16" : "fp16";
  CpuPathChoice c{type + "_gemm_via_fp32", type + " GEMMs (Linear, attention)", "ATen's " + type + " GEMMs (at::linear, SDPA)", "", false};
  if (cpu_fallback_forced(c.path)) return c.why = "forced by STRATA_CPU_FALLBACK", c;
  if (aten_has_half_gemm(half)) return c.why = "ATen's oneDNN runs " + type + " GEMMs on this CPU", c;
  c.chosen = "fp32 GEMMs on the widened operands (Linear: each result rounded to " + type + "; attention: the blocked kernel)",
  c.fast = true;
  c.why = "ATen's oneDNN has no " + type + " GEMM on this CPU (it needs AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX), so ATen's is scalar";
  return c;
}
CpuPathChoice decide_bf16_gemms() { return decide_half_gemms(at::kBFloat16); }
CpuPathChoice decide_fp16_gemms() { return decide_half_gemms(at::kHalf); }

}  // namespace

bool half_gemms_via_fp32(at::ScalarType half) {
  static const bool bf16 = decide_cpu_path(&decide_bf16_gemms);
  static const bool fp16 = decide_cpu_path(&decide_fp16_gemms);
  return half == at::kBFloat16 ? bf16 : half == at::kHalf && fp16;
}

bool onednn_linear_chosen() {
  static const bool chosen = decide_cpu_path(&decide_onednn_linear);
  return chosen;
}

bool onednn_matmul_chosen() {
  static const bool chosen = decide_cpu_path(&decide_onednn_matmul);
  return chosen;
}

at::Tensor linear_weight_gradient(const at::Tensor& dy, const at::Tensor& rows) {
  if (!onednn_matmul_chosen()) return dy.t().mm(rows);
  // Not a dispatched op, so the profiler would fold this GEMM into the autograd node's self
  // time; the named range keeps it visible in [job] profile_steps tables.
  RECORD_FUNCTION("strata::linear_weight_gradient", std::vector<c10::IValue>{});
  at::Tensor dw = at::empty({dy.size(1), rows.size(1)}, rows.options());
  at::native::mkldnn_matmul(dy.t(), rows, dw, /*beta=*/0.f, /*alpha=*/1.f);
  return dw;
}

at::Tensor linear_onednn_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const auto on_cpu = [](const at::Tensor& t) { return t.device().is_cpu(); };
  if (!on_cpu(x) || !on_cpu(weight) || (bias && !on_cpu(*bias)) || x.numel() == 0 || weight.numel() == 0 || x.dim() < 1 ||
      weight.dim() != 2)
    return at::linear(x, weight, bias);
  TORCH_CHECK(x.size(-1) == weight.size(1), "linear: x's last dimension ", x.size(-1), " is not the weight's input size ",
              weight.size(1));
  // The type the GEMMs run in: autocast's for a Linear where it is on, else the operands'.
  const bool autocast = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
  const at::ScalarType dtype = autocast ? at::autocast::get_autocast_dtype(c10::DeviceType::CPU) : x.scalar_type();
  if (dtype == at::kBFloat16 || dtype == at::kHalf) {
    if (!half_gemms_via_fp32(dtype)) return at::linear(x, weight, bias);
    // Autocast's own casts (cached: a weight is cast once per forward), then no autocast below.
    const auto cast = [&](const at::Tensor& t) { return autocast ? at::autocast::cached_cast(dtype, t, c10::DeviceType::CPU) : t; };
    const at::Tensor x16 = cast(x), w16 = cast(weight), b16 = bias ? cast(*bias) : at::empty({0}, w16.options().requires_grad(false));
    if (x16.scalar_type() != dtype || w16.scalar_type() != dtype || b16.scalar_type() != dtype) return at::linear(x, weight, bias);
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return HalfLinearViaFp32::apply(x16, w16, b16);
  }
  const auto fp32 = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat; };
  if (autocast || !fp32(x) || !fp32(weight) || (bias && !fp32(*bias)) || !onednn_linear_chosen()) return at::linear(x, weight, bias);
  return OnednnLinear::apply(x, weight, bias ? *bias : at::empty({0}, weight.options().requires_grad(false)));
}

}  // namespace strata::kernels
