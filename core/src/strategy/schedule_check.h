// The learning-rate schedule's keys against the schedule chosen (engine/schedule.h): a key the
// chosen schedule does not read is refused where it differs from its default (a saved strategy
// states every key, defaults included): min_lr_ratio under "constant", decay_fraction and
// decay_shape under anything but "wsd". Nothing silently ignored.
#pragma once

#include "strata/core/strategy.h"

namespace strata {

void check_schedule(const Config& optimizer, Diagnostics& diagnostics);

}  // namespace strata
