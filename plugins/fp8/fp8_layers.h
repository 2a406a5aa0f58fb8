// Which Linear layers of a model the fp8 pass runs in fp8: those whose module name matches the
// include/exclude substrings and whose *whole* weight has both dimensions multiples of 16 (what
// fp8 GEMM kernels need). Whole, not this rank's piece: the layers in fp8 must not depend on the
// layout, or a run at tensor 2 would quantize other layers than the same run in one process
// (issue 57: Llama's 16 x 64 k/v projections split into 8 x 64 pieces were left in high precision
// at tensor 2 only). A piece that is not a multiple of 16 runs on the CPU (Strata's product takes
// any shape); on CUDA the pass refuses it (`misaligned`).
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
  std::vector<std::string> misaligned;                   // "name [out x in]": fp8, this rank's piece not a multiple of 16
};

// include empty: every Linear; a name matches a list when it contains one of its entries.
LayerChoice choose_layers(nn::Model& model, const StringList& include, const StringList& exclude);

// Whether the name of a Linear layer of `model` contains `part` (an include or exclude entry).
bool names_a_linear(nn::Model& model, const std::string& part);

}  // namespace strata::fp8
