// Which parameters form which fsdp unit. Decided from the blocks' names, types and parameter
// shapes only, so the same rule answers for the built model (FsdpPass::apply) and for its outline
// before anything is built (sharded initialisation, fsdp_sharded_init.h): both must lay out every
// unit's flat buffer identically, or a rank would keep the wrong slice.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "strata/config.h"
#include "strata/nn.h"

namespace strata::fsdp {

// A block as unit planning sees it: its trainable parameters by full name ("h.0.attn.c_attn.weight")
// and element count, in the block's order.
struct BlockInfo {
  std::string name, type;
  std::vector<std::pair<std::string, int64_t>> params;
};

// Blocks [first, last] of the model that form one wrapped unit.
struct BlockRun {
  size_t first, last;
};

struct UnitPlan {
  std::vector<BlockInfo> blocks;                    // every block, built or absent (nn::block_parameter_shapes)
  std::vector<BlockRun> runs;                       // wrapped runs, in model order
  std::vector<std::vector<std::string>> run_params;  // each run's parameters (empty: nothing to shard)
  std::vector<std::string> root;     // parameters of no wrapped run, and tied ones
  std::vector<std::string> ignored;  // parameters of ignored blocks: kept whole
};

// Wrapped runs: named or typed blocks one each, then with min_params > 0 the remaining
// consecutive blocks grouped in model order until each group has at least min_params parameters
// (a smaller remainder stays in the root unit). Tied parameters (Model::shared_parameters) are
// read by several blocks, so they live in the root unit. `model` may be the built model or its outline.
UnitPlan plan_units(const nn::Model& model, const Config& config);

}  // namespace strata::fsdp
