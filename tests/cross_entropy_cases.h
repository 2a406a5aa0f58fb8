// What the fused cross-entropy tests share, CPU (unit/cross_entropy_kernel_test.cpp) and GPU
// (gpu/cross_entropy_cuda_test.cpp): the loss and the logits' gradient of one call, the fp64
// formula, targets with ignored rows, and the fp16 loss-scaling case.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace strata::testing {

struct LossAndGrad {
  at::Tensor loss, grad;
};

// fn's loss on a fresh leaf copy of logits0 and the gradient of scale x loss to the logits.
template <class Fn>
LossAndGrad loss_and_grad(Fn fn, const at::Tensor& logits0, const at::Tensor& targets, double scale = 1.0) {
  const at::Tensor logits = logits0.clone().requires_grad_(true);
  const at::Tensor loss = fn(logits, targets);
  const at::Tensor grad = torch::autograd::grad({loss * scale}, {logits})[0];
  return {loss.detach(), grad};
}

// The formula, in whatever dtype the logits have (fp64 in the tests).
inline at::Tensor exact_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits, targets);
}

// Targets in [0, vocab) with every third row ignored (-100; when there is more than one row).
inline at::Tensor targets_for(int64_t rows, int64_t vocab, at::Device device = at::kCPU) {
  at::Tensor t = at::randint(vocab, {rows}, at::kLong);
  if (rows > 1) t.slice(0, 0, rows, 3).fill_(-100);
  return t.to(device);
}

// fp16 loss scaling (g = 65536) on half logits: g G must be rounded to half once, after scaling.
// Rounding G first flushes its small entries (below half's 6e-8) to zero before they are scaled
// up, which made amp.fp16_close_to_fp32's loss curve drift by 2e-2. Every entry that is a
// normal half number once scaled must be within one half rounding of the reference's g G
// (`reference` takes the half logits and rounds its gradient once, through its cast).
template <class Fused, class Reference>
void expect_half_loss_scaling_rounds_once(Fused fused, Reference reference, at::Device device) {
  at::manual_seed(4);
  const at::Tensor logits = (at::randn({48, 4099}) * 3).to(at::kHalf).to(device), targets = targets_for(48, 4099, device);
  const LossAndGrad ours = loss_and_grad(fused, logits, targets, 65536.0), ref = loss_and_grad(reference, logits, targets, 65536.0);
  EXPECT_EQ(ours.grad.scalar_type(), at::kHalf);
  const at::Tensor expected = ref.grad.to(at::kFloat), got = ours.grad.to(at::kFloat);
  const at::Tensor normal = expected.abs() >= 6.2e-5;  // half's smallest normal number
  ASSERT_GT(normal.sum().item<int64_t>(), 0);
  EXPECT_LE(((got - expected).abs() / expected.abs()).masked_select(normal).max().item<double>(), 1e-3);
}

}  // namespace strata::testing
