// The one header a plugin includes to get the whole plugin ABI.
#pragma once

#include "strata/abi.h"
#include "strata/comm.h"
#include "strata/component.h"
#include "strata/config.h"
#include "strata/data.h"
#include "strata/errors.h"
#include "strata/job.h"
#include "strata/model.h"
#include "strata/nn.h"
#include "strata/ops.h"
#include "strata/optimizer.h"
#include "strata/pass.h"
#include "strata/registry.h"
#include "strata/topology.h"
