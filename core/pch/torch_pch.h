// The libtorch headers most Strata code needs, compiled once (see cmake/StrataTorch.cmake).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
