// The plugin ABI's types in this library's debug information, for libabigail (sdk/abi/abi_check,
// docs/plugin-abi.md "How it is checked").
//
// abidw reads types from DWARF. The rest of libstrata_core is built without -g (build time and
// size); this one file is built with -g -fno-eliminate-unused-debug-types
// -femit-class-debug-always (core/CMakeLists.txt), so every class, enum and virtual table declared
// in plugin_api/include is described once, also the interfaces only plugins implement and no
// exported function names. The check keeps only the types those headers declare
// (sdk/abi/plugin_headers.suppr).
#include "strata/abi.h"
#include "strata/claims.h"
#include "strata/comm.h"
#include "strata/component.h"
#include "strata/config.h"
#include "strata/cost.h"
#include "strata/cpu.h"
#include "strata/data.h"
#include "strata/dist.h"
#include "strata/errors.h"
#include "strata/export.h"
#include "strata/interchange.h"
#include "strata/job.h"
#include "strata/model.h"
#include "strata/nn.h"
#include "strata/ops.h"
#include "strata/optimizer.h"
#include "strata/pass.h"
#include "strata/pipeline.h"
#include "strata/placement.h"
#include "strata/plugin.h"
#include "strata/registry.h"
#include "strata/rng.h"
#include "strata/step_program.h"
#include "strata/topology.h"
