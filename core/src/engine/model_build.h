// This rank's model as the passes first see it (see model_build.cpp).
#pragma once

#include <memory>
#include <vector>

#include "strata/core/strategy.h"
#include "strata/job.h"

namespace strata::engine {

// Builds [model] at this rank's tensor-parallel shapes from the current generator state, with
// the blocks no enabled pass wants on this rank absent (Pass::blocks_to_build). `order` is the
// passes' application order (indices into plan.passes). A model that does not fit is a UserError.
std::shared_ptr<nn::Model> build_rank_model(const ResolvedStrategy& plan, const std::vector<size_t>& order, const Job& job);

}  // namespace strata::engine
