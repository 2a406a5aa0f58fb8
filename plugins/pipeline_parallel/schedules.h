// The bundled pipeline schedules: gpipe, 1f1b, interleaved and zero_bubble (strata/pipeline.h).
#pragma once

#include "strata/registry.h"

namespace strata::pipeline {

void register_schedules(Registry& registry);

}  // namespace strata::pipeline
