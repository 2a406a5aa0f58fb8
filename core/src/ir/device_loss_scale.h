// Core's side of StepProgram::set_device_loss_scale: the scale auxiliary losses' backward
// (nn::add_auxiliary_loss, in nn.cpp) multiplies in besides LossGradientScale's host factor. One
// per process, as LossGradientScale is: CUDA's autograd runs backward on its own threads.
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::nn {

void set_device_loss_scale(const at::Tensor& scale);
// Clears it if it is still `scale` (a program that set it is going away).
void forget_device_loss_scale(const at::Tensor& scale);

}  // namespace strata::nn
