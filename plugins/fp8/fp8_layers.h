// Which Linear layers of a model the fp8 pass runs in fp8: those whose module name matches the
// include/exclude substrings and whose local weight (after tensor-parallel splitting) has both
// dimensions multiples of 16 (what fp8 GEMM kernels need; the CPU's _scaled_mm would take any).
#pragma once

#include <string>
#include <vector>

#include "strata/config.h"
#include "strata/nn.h"

namespace strata::fp8 {

// Both GEMM dimensions of the weight must be multiples of this.
inline constexpr int64_t kDimMultiple = 16;

struct LayerChoice {
  std::vector<std::pair<std::string, nn::Linear*>> fp8;  // in model order
  std::vector<std::string> too_small;                    // "name [out x in]": left in high precision
};

// include empty: every Linear; a name matches a list when it contains one of its entries.
LayerChoice choose_layers(nn::Model& model, const StringList& include, const StringList& exclude);

}  // namespace strata::fp8
