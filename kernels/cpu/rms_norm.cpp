// The CPU side of rms_norm_autograd.h (rms_norm.h): rows split over ATen's threads; the backward
// gives each thread a contiguous group of rows and its own dw partial sum (no atomics), which the
// autograd adds. Sums of squares and of g x run in eight float lanes (vectorised by the
// compiler), the rest elementwise. add_rms_norm's forms (add_forward, backward's dx_plus and
// dx_branch) do the residual add in the same row loops, in the unfused step's roundings.
#include "rms_norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "rms_norm_autograd.h"

namespace strata::kernels {
namespace {

template <class T>
float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));  // float: the identity; bf16/half: round to nearest even
}

// sum_j f(j) in eight float lanes.
template <class F>
float lane_sum(int64_t n, F f) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += f(j + k);
  float total = 0;
  for (; j < n; ++j) total += f(j);
  for (float lane : lanes) total += lane;
  return total;
}

// Calls f with null pointers of x's, the weight's and the output's storage types.
template <class F>
void with_types(at::ScalarType x_type, at::ScalarType weight_type, F f) {
  const bool float_weight = weight_type == at::kFloat;
  switch (x_type) {
    case at::kFloat: return f(static_cast<float*>(nullptr), static_cast<float*>(nullptr), static_cast<float*>(nullptr));
    case at::kBFloat16:
      if (float_weight) return f(static_cast<c10::BFloat16*>(nullptr), static_cast<float*>(nullptr), static_cast<float*>(nullptr));
      return f(static_cast<c10::BFloat16*>(nullptr), static_cast<c10::BFloat16*>(nullptr), static_cast<c10::BFloat16*>(nullptr));
    default:
      if (float_weight) return f(static_cast<c10::Half*>(nullptr), static_cast<float*>(nullptr), static_cast<float*>(nullptr));
      return f(static_cast<c10::Half*>(nullptr), static_cast<c10::Half*>(nullptr), static_cast<c10::Half*>(nullptr));
  }
}

// One row's norm: rstd from the sum of squares, then y = w * round_T(x * rstd).
template <class T, class W, class O>
float normalize_row(const T* xr, const W* w, O* yr, int64_t dim, double eps) {
  const float squares = lane_sum(dim, [&](int64_t j) {
    const float v = static_cast<float>(xr[j]);
    return v * v;
  });
  const float r = 1.0f / std::sqrt(squares / static_cast<float>(dim) + static_cast<float>(eps));
  for (int64_t j = 0; j < dim; ++j) yr[j] = static_cast<O>(static_cast<float>(w[j]) * round_to<T>(static_cast<float>(xr[j]) * r));
  return r;
}

// Calls f with a null pointer of the branch x's storage type: the sum's type T, or (T float) a
// 16-bit x that ATen's add promotes (the autocast branch on an fp32 residual stream).
template <class T, class F>
void with_branch_type(at::ScalarType x_type, F f) {
  if constexpr (std::is_same_v<T, float>) {
    if (x_type == at::kBFloat16) return f(static_cast<c10::BFloat16*>(nullptr));
    if (x_type == at::kHalf) return f(static_cast<c10::Half*>(nullptr));
  }
  return f(static_cast<T*>(nullptr));
}

// Row `row` of dx (T) stored into dx_branch's dtype: the branch's gradient, cast where it is made.
template <class T>
void store_branch_row(const T* dxr, const at::Tensor& dx_branch, int64_t row, int64_t dim) {
  with_branch_type<T>(dx_branch.scalar_type(), [&](auto* bt) {
    using B = std::remove_pointer_t<decltype(bt)>;
    B* out = dx_branch.mutable_data_ptr<B>() + row * dim;
    for (int64_t j = 0; j < dim; ++j) out[j] = static_cast<B>(static_cast<float>(dxr[j]));
  });
}

int64_t rows_per_task(int64_t dim) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, dim)); }

struct CpuKernels {
  static void forward(const at::Tensor& x_t, const at::Tensor& w_t, const at::Tensor& y_t, const at::Tensor& rstd_t, double eps) {
    const int64_t dim = x_t.size(-1), rows = dim > 0 ? x_t.numel() / dim : 0;
    with_types(x_t.scalar_type(), w_t.scalar_type(), [&](auto* tt, auto* wt, auto* ot) {
      using T = std::remove_pointer_t<decltype(tt)>;
      using W = std::remove_pointer_t<decltype(wt)>;
      using O = std::remove_pointer_t<decltype(ot)>;
      const T* x = x_t.const_data_ptr<T>();
      const W* w = w_t.const_data_ptr<W>();
      O* y = y_t.mutable_data_ptr<O>();
      float* rstd = rstd_t.mutable_data_ptr<float>();
      at::parallel_for(0, rows, rows_per_task(dim), [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) rstd[row] = normalize_row(x + row * dim, w, y + row * dim, dim, eps);
      });
    });
  }

  // sum = round_T(residual + x), written out, then forward's norm of each sum row while it is in
  // cache: the add's own pass over the three tensors is gone. residual is T; x is T or 16-bit.
  static void add_forward(const at::Tensor& residual_t, const at::Tensor& x_t, const at::Tensor& w_t, const at::Tensor& sum_t,
                          const at::Tensor& y_t, const at::Tensor& rstd_t, double eps) {
    const int64_t dim = sum_t.size(-1), rows = dim > 0 ? sum_t.numel() / dim : 0;
    with_types(sum_t.scalar_type(), w_t.scalar_type(), [&](auto* tt, auto* wt, auto* ot) {
      using T = std::remove_pointer_t<decltype(tt)>;
      using W = std::remove_pointer_t<decltype(wt)>;
      using O = std::remove_pointer_t<decltype(ot)>;
      with_branch_type<T>(x_t.scalar_type(), [&](auto* bt) {
        using B = std::remove_pointer_t<decltype(bt)>;
        const T* residual = residual_t.const_data_ptr<T>();
        const B* x = x_t.const_data_ptr<B>();
        const W* w = w_t.const_data_ptr<W>();
        T* sum = sum_t.mutable_data_ptr<T>();
        O* y = y_t.mutable_data_ptr<O>();
        float* rstd = rstd_t.mutable_data_ptr<float>();
        at::parallel_for(0, rows, rows_per_task(dim), [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            T* sr = sum + row * dim;
            const T* rr = residual + row * dim;
            const B* xr = x + row * dim;
            for (int64_t j = 0; j < dim; ++j) sr[j] = static_cast<T>(static_cast<float>(rr[j]) + static_cast<float>(xr[j]));
            rstd[row] = normalize_row(sr, w, y + row * dim, dim, eps);
          }
        });
      });
    });
  }

  static int64_t backward_groups(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>(rows, at::get_num_threads())); }

  // add_rms_norm: dx += dx_plus, in x's dtype (the residual path's gradient of the sum, which
  // autograd would otherwise add in a pass of its own), and dx stored again in dx_branch's 16-bit
  // dtype (the branch's gradient) where that is defined; undefined: none.
  static void backward(const at::Tensor& x_t, const at::Tensor& w_t, const at::Tensor& rstd_t, const at::Tensor& dy_t,
                       const at::Tensor& dx_t, const at::Tensor& partial_t, const at::Tensor& dx_plus_t = {},
                       const at::Tensor& dx_branch_t = {}) {
    const int64_t dim = x_t.size(-1), rows = dim > 0 ? x_t.numel() / dim : 0, groups = partial_t.size(0);
    with_types(x_t.scalar_type(), w_t.scalar_type(), [&](auto* tt, auto* wt, auto* ot) {
      using T = std::remove_pointer_t<decltype(tt)>;
      using W = std::remove_pointer_t<decltype(wt)>;
      using O = std::remove_pointer_t<decltype(ot)>;
      const T* x = x_t.const_data_ptr<T>();
      const W* w = w_t.const_data_ptr<W>();
      const O* dy = dy_t.const_data_ptr<O>();
      const float* rstd = rstd_t.const_data_ptr<float>();
      T* dx = dx_t.mutable_data_ptr<T>();
      const T* dx_plus = dx_plus_t.defined() ? dx_plus_t.const_data_ptr<T>() : nullptr;
      float* partials = partial_t.mutable_data_ptr<float>();
      at::parallel_for(0, groups, 1, [&](int64_t first_group, int64_t last_group) {
        for (int64_t group = first_group; group < last_group; ++group) {
          float* partial = partials + group * dim;
          for (int64_t row = rows * group / groups; row < rows * (group + 1) / groups; ++row) {
            const T* xr = x + row * dim;
            const O* dyr = dy + row * dim;
            const float r = rstd[row];
            // g = round_T(dy w), the gradient of the rounded normalised row, as autograd rounds it.
            const float gx = lane_sum(dim, [&](int64_t j) {
              return round_to<T>(static_cast<float>(dyr[j]) * static_cast<float>(w[j])) * static_cast<float>(xr[j]);
            });
            for (int64_t j = 0; j < dim; ++j) partial[j] += static_cast<float>(dyr[j]) * round_to<T>(static_cast<float>(xr[j]) * r);
            const float correction = r * r * r * gx / static_cast<float>(dim);
            T* dxr = dx + row * dim;
            for (int64_t j = 0; j < dim; ++j) {
              const float g = round_to<T>(static_cast<float>(dyr[j]) * static_cast<float>(w[j]));
              dxr[j] = static_cast<T>(r * g - correction * static_cast<float>(xr[j]));
            }
            // Rounded to T first, then added and rounded again: autograd's accumulation exactly.
            if (dx_plus)
              for (int64_t j = 0; j < dim; ++j)
                dxr[j] = static_cast<T>(static_cast<float>(dxr[j]) + static_cast<float>(dx_plus[row * dim + j]));
            if (dx_branch_t.defined()) store_branch_row(dxr, dx_branch_t, row, dim);
          }
        }
      });
    });
  }
};

}  // namespace

at::Tensor rms_norm_fused_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!rms_norm_fused_takes(x, weight, c10::DeviceType::CPU)) return rms_norm_reference_call(x, weight, eps);
  return RmsNormFunction<CpuKernels>::apply(x, weight, eps, kPromotedOutput);
}

ops::AddNormResult add_rms_norm_fused_cpu(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                          double eps) {
  // fp32 sums only: with a 16-bit sum the scalar conversions in the add's loops cost more than the
  // pass they save (0.84-0.90x the unfused step's time up to 4096 x 1024 rows in bf16,
  // bench/results/add_rms_norm_cpu.md).
  if (residual.scalar_type() != at::kFloat || !add_rms_norm_fused_takes(residual, x, weight, c10::DeviceType::CPU, "rms_norm.fused_cpu"))
    return add_rms_norm_reference_call(residual, x, weight, eps);
  const auto out = AddRmsNormFunction<CpuKernels>::apply(residual, x, weight, eps, kPromotedOutput);
  return {out[0], out[1]};
}

}  // namespace strata::kernels
