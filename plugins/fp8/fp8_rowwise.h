// Row-wise fp8 scaling (the `rowwise` recipe): dynamic, one scale per row of each GEMM's left
// operand and per column of its right operand, each from the amax along the GEMM's contracted
// dimension (torchao's "rowwise"/axiswise recipe; cuBLASLt's row-wise scaled GEMM). An outlier
// then costs precision in its own row only, not in the whole tensor as with one tensorwise scale.
//
// A Linear y = x w^T has three GEMMs, each contracting over another dimension, so each operand is
// quantized once per GEMM it enters, along that GEMM's contracted dimension:
//   output           y  = x  w^T   over in      x: a scale per token     w: per output feature
//   input gradient   dx = dy w     over out     dy: per token            w: per input feature
//   weight gradient  dw = dy^T x   over tokens  dy: per output feature   x: per input feature
// Backward therefore keeps x and w in high precision (tensorwise recipes keep their fp8 copies).
//
// When the contracted dimension is split over ranks (the in dimension of a Row-split layer, out
// of a Column-split one, tokens over data and context ranks), the per-row amaxes are all-reduced
// (max) over those ranks (`reduce_amax`), so every layout quantizes exactly as one process would.
#pragma once

#include <optional>

#include <ATen/ATen.h>

#include "fp8_numerics.h"
#include "strata/comm.h"

namespace strata::fp8 {

struct RowwiseScaling {
  Format forward = Format::E4M3;   // inputs and weights
  Format backward = Format::E5M2;  // output gradients
  int64_t margin = 0;
  // The ranks holding other parts of each contracted dimension; null: it is whole on this rank.
  Communicator* in_split = nullptr;   // Row-split layers: the tensor ranks
  Communicator* out_split = nullptr;  // Column-split layers: the tensor ranks
  Communicator* tokens = nullptr;     // the data and context ranks
};

// One scale per slice of x along `dim`'s complement: fp8_max / amax(|x| along dim) / 2^margin,
// keepdim (so [M, 1] for dim 1, [1, N] for dim 0); 1 where a slice is all zeros.
at::Tensor axis_scale(const at::Tensor& x, int64_t dim, Communicator* group, Format format, int64_t margin);

// a [M, K] @ b [K, N] of fp8 operands dequantized by a_inverse [M, 1] and b_inverse [1, N]: the
// fp8 GEMM with unit scales, accumulating in fp32, then the scales as its epilogue (the CPU's
// _scaled_mm in torch 2.11 takes per-tensor scales only).
at::Tensor rowwise_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_inverse, const at::Tensor& b_inverse);

// The layer's output in `out_dtype`; x [.., in], w [out, in], b [out]; gradients as ops::linear's.
at::Tensor fp8_linear_rowwise(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                              const RowwiseScaling& scaling, at::ScalarType out_dtype);

}  // namespace strata::fp8
