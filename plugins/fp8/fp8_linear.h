// The fp8 computation of one Linear layer: y = x w^T (+ b) with all three GEMMs (output, input
// gradient, weight gradient) through at::_scaled_mm on fp8 operands, the bias in high precision.
#pragma once

#include <memory>
#include <optional>

#include <ATen/ATen.h>

#include "fp8_numerics.h"
#include "strata/comm.h"

namespace strata::fp8 {

enum class Recipe { Delayed, Current };

// How every fp8 layer of a job scales its tensors. Tensor indices: layer k owns 3k (input),
// 3k + 1 (weight) and 3k + 2 (output gradient).
class Scaling {
 public:
  Recipe recipe = Recipe::Delayed;
  Format forward = Format::E4M3;   // inputs and weights
  Format backward = Format::E5M2;  // output gradients (HYBRID), or E4M3
  int64_t margin = 0;
  // Delayed: the amax histories and scales (job state). Unused by the current recipe.
  std::shared_ptr<DelayedScaling> delayed;
  // With reduce_amax: a tensor's own amax (the current recipe; the delayed one before its first
  // scale update) is all-reduced (max) over this group before its scale is taken, so every rank
  // quantizes with the same scale. Null: this rank's own amax.
  Communicator* current_group = nullptr;
  // Set between BeforeEvaluate and AfterEvaluate: evaluation does not record amaxes, so it
  // cannot change the scales training uses.
  bool evaluating = false;

  // The scale to quantize tensor `index` (holding x) with. Delayed: the scale from previous
  // steps (x's own before the first update), and x's amax is recorded for the next update.
  // Current: from x's own amax.
  at::Tensor scale_for(int64_t index, const at::Tensor& x, Format format);
};

// The layer's output in `out_dtype`; x [.., in], w [out, in], b [out]. Gradients flow to x, w and
// b as for ops::linear. `layer` is the layer's index among fp8 layers (its tensors in `scaling`).
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, Scaling& scaling,
                      int64_t layer, at::ScalarType out_dtype);

// a [M, K] @ b [K, N] of fp8 operands, dequantized by the inverse scales, in fp32 (mat1
// row-major and mat2 column-major, the layouts CUDA's _scaled_mm requires; the CPU takes any).
// On the CPU: ATen's _scaled_mm where a trial call runs it (cpu_scaled_mm_chosen), else the fp32
// product of the fp8 values, scaled.
at::Tensor scaled_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale, const at::Tensor& b_scale);

// Whether ATen's _scaled_mm serves fp8 GEMMs on this CPU (decided once, recorded with its reason:
// strata/cpu.h; STRATA_CPU_FALLBACK=fp8_scaled_mm forces the fallback).
bool cpu_scaled_mm_chosen();

}  // namespace strata::fp8
