// Orders enabled passes and checks their requires/conflicts/after/before declarations.
#pragma once

#include <vector>

#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"

namespace strata {

// Indices into `passes` of the enabled passes, in the order they apply. Order: phase first,
// then position in the strategy, except where after/before say otherwise. Every missing
// requirement, conflict and cycle is reported; the result is empty when there is any.
STRATA_API std::vector<size_t> order_passes(const std::vector<PassEntry>& passes, Diagnostics& diagnostics);

// Checks the enabled passes' claims against the layout: every [parallel] dimension larger than
// one is claimed by exactly one enabled pass, and no stage has two owners. `registry` names the
// passes that could claim an unclaimed dimension.
STRATA_API void check_claims(const ResolvedStrategy& plan, const ComponentRegistry& registry, Diagnostics& diagnostics);

}  // namespace strata
