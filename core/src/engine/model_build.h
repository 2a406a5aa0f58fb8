// This rank's model as the passes first see it (see model_build.cpp).
#pragma once

#include <memory>
#include <vector>

#include "strata/core/strategy.h"
#include "strata/job.h"

namespace strata::engine {

// Builds [model] at this rank's tensor-parallel shapes from the current generator state, with
// the blocks no enabled pass wants on this rank absent (Pass::blocks_to_build). `order` is the
// passes' application order (indices into plan.passes). A pass that shards parameters keeps only
// this rank's part of each block as it is built (Pass::keeper_at_build). Sets job.model (on the
// job's device) and job.build_keeper. A model that does not fit is a UserError.
// `weights_from_checkpoint`: a checkpoint will give every weight (a resume that found one), so
// [model] init_from is not loaded.
void build_rank_model(const ResolvedStrategy& plan, const std::vector<size_t>& order, Job& job, bool weights_from_checkpoint);

}  // namespace strata::engine
