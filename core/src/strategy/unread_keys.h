// Keys a strategy states (other than their defaults) for a feature that is off. Where its switch
// was left out (default origin) the key was likely meant to turn it on, and is refused at plan
// time, one line each, naming the switch to set. A strategy that states the switch off
// (`--set job.eval_every=0` on a strategy that sizes its evaluations, a saved strategy, which
// states every key) has said the feature is off: its keys wait unread, each named in a note that
// `strata plan` and `strata run` print. Nothing silently ignored:
//   [optimizer] decay_fraction, decay_shape: schedule = "wsd" (engine/schedule.h); min_lr_ratio:
//               any schedule but "constant"
//   [job]       eval_batches: eval_every; snapshot_replicas: flash_every; restart_backoff:
//               max_restarts; min_ranks: max_restarts, or health_check's exclusion
// and, refused whether stated or not, [data] reset_positions without document_end, and a
// document_end outside the model's vocabulary.
#pragma once

#include <string>
#include <vector>

#include "strata/core/strategy.h"

namespace strata {

// Errors go to `diagnostics`, notes (one line each, no "note:") to `notes`.
void check_unread_keys(const ResolvedStrategy& plan, Diagnostics& diagnostics, std::vector<std::string>& notes);

}  // namespace strata
