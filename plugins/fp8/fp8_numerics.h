// FP8 numerics of the fp8 pass: the two formats, quantization (scale, saturate, round to nearest
// even), and delayed scaling (Transformer Engine's DelayedScaling recipe): per scaled tensor a
// history of the amaxes of previous steps and the scale derived from it.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace strata::fp8 {

// E4M3 (float8_e4m3fn: max 448, no infinities) for the forward's inputs and weights; E5M2
// (float8_e5m2: max 57344) for gradients under the HYBRID format.
enum class Format { E4M3, E5M2 };

double max_of(Format format);
at::ScalarType dtype_of(Format format);

// The quantized tensor: x * scale computed in fp32, saturated to +-max_of(format), cast to the
// fp8 dtype with round-to-nearest-even (the cast alone would turn values beyond the range into
// NaN for E4M3 and infinity for E5M2: saturation must come first). `scale` is a 0-dim fp32 tensor.
at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, Format format);

// max |x| as a 0-dim fp32 tensor (0 for an empty tensor).
at::Tensor abs_max(const at::Tensor& x);

// scale = fp8_max / amax / 2^margin, elementwise; where amax is 0 or not finite the previous
// scale is kept (a tensor that was all zeros says nothing about the range).
at::Tensor scale_from_amax(const at::Tensor& amax, const at::Tensor& fp8_max, int64_t margin, const at::Tensor& previous);

// Delayed scaling of `count` tensors at once (three per fp8 layer: input, weight, output
// gradient), so that one all-reduce serves every layer.
//   pending [count]       the amax seen in the running step: max over its micro-batches (and over
//                         an activation-checkpointing recomputation, which sees the same values)
//   history [count, len]  amaxes of previous steps, column 0 the most recent
//   scale   [count]       the scale quantization uses now (1 until the first update)
// At the end of each step, roll() pushes pending into the history; every `interval` steps
// update_scales() derives the scales from it. Until the first update (`updated` false) there is
// no history to scale by: the fp8 layer then scales each tensor by its own amax, as torchao's
// delayed scaling initialises from the first cast, rather than Transformer Engine's initial
// scale 1, with which most E5M2 output gradients of the first step underflow.
class DelayedScaling {
 public:
  DelayedScaling(int64_t count, int64_t history_len, at::Tensor fp8_max, at::Device device);

  // Records an amax seen for tensor `index` in the running step (max with what it already saw).
  void observe(int64_t index, const at::Tensor& amax);
  // Pushes the step's amaxes into the history (a non-finite amax, from a step with overflowing
  // values that amp skips, is recorded as 0 so it cannot poison the history) and clears them.
  void roll();
  // scale from the history's max ("max") or its most recent entry ("most_recent"), with margin.
  void update_scales(bool use_max, int64_t margin);

  int64_t count() const { return pending.size(0); }

  at::Tensor pending, history, scale;
  bool updated = false;  // update_scales() has run: `scale` comes from a history
  at::Tensor fp8_max;  // [count], fp32: the format's max per tensor
};

}  // namespace strata::fp8
