// Strategy::automatic's choice for the library API (see accelerate_automatic.cpp).
#pragma once

#include <string>

#include "strata/accelerate.h"
#include "strata/core/strategy.h"

namespace strata {

// The strategy Strategy::automatic picks around `base` for `world_size` ranks, with what it did
// in `status`. Collective when it measures: every rank calls it with the same arguments.
RawStrategy automatic_strategy(const RawStrategy& base, const ComponentRegistry& registry, const Strategy& strategy, int64_t world_size,
                               const RunOptions& run, std::string& status);

}  // namespace strata
