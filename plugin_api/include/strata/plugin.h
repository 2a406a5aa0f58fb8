// The one header a plugin includes to get the whole plugin ABI.
#pragma once

#include "strata/abi.h"
#include "strata/component.h"
#include "strata/config.h"
#include "strata/errors.h"
#include "strata/pass.h"
#include "strata/registry.h"
