// The memory this process holds now, as the operating system counts it (resident set): what the
// step log prints, what `strata doctor` reports a rank starts with, and what `strata tune` adds to
// the model states and activations it predicts.
#pragma once

#include "strata/export.h"

namespace strata {

STRATA_API double resident_bytes();

}  // namespace strata
