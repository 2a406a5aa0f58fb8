// What `strata tune` divides its cost model's figures by: this machine's rates, measured when tune
// starts (strata/core/tune.h: HardwareRates).
#pragma once

#include <cstdint>

#include "strata/core/tune.h"

namespace strata::cli {

HardwareRates measure_rates(int64_t ranks);

}  // namespace strata::cli
