// Keys a strategy states for a feature it never switched on: refused at plan time, one line each,
// naming the switch to set. A key is refused where it differs from its default and its switch
// was left out (default origin), so it was likely forgotten; a strategy that states the switch
// off (`--set job.eval_every=0` on a strategy that sizes its evaluations, a saved strategy, which
// states every key) has said the feature is off, and its other keys wait unread. Nothing
// silently ignored:
//   [optimizer] decay_fraction, decay_shape: schedule = "wsd" (engine/schedule.h)
//   [job]       eval_batches: eval_every; snapshot_replicas: flash_every; restart_backoff:
//               max_restarts; min_ranks: max_restarts, or health_check's exclusion
#pragma once

#include "strata/core/strategy.h"

namespace strata {

void check_unread_keys(const ResolvedStrategy& plan, Diagnostics& diagnostics);

}  // namespace strata
