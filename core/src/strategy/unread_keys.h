// Keys a strategy states that nothing would read, because another key turns their feature off:
// refused at plan time, one line each, where they differ from their defaults (a saved strategy
// states every key, defaults included). Nothing silently ignored.
//   [optimizer] min_lr_ratio under schedule = "constant"; decay_fraction and decay_shape under
//               any schedule but "wsd" (engine/schedule.h)
//   [job]       eval_batches with eval_every = 0 (no evaluation runs); keep_checkpoints with no
//               checkpoint taken (checkpoint_every = 0, checkpoint_at_end = false, flash_every = 0);
//               snapshot_replicas with flash_every = 0 (no flash snapshot to replicate);
//               restart_backoff with max_restarts = 0; min_ranks with neither restarts nor the
//               health check's exclusion
#pragma once

#include "strata/core/strategy.h"

namespace strata {

void check_unread_keys(const ResolvedStrategy& plan, Diagnostics& diagnostics);

}  // namespace strata
