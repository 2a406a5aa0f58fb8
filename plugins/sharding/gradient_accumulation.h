// Where a step's gradients live between its micro-batches under the reduce-scattering passes
// (zero2, fsdp): accumulated whole and reduced once by the last backward (the least
// communication; every full gradient held from the first backward to the last), or, with
// `reduce_every_micro_batch`, each micro-batch's share reduce-scattered as its unit or bucket
// completes and summed in this rank's gradient chunk (m reductions per step; no full gradient
// outlives its micro-batch). FlatUnit::start_reduce(final) sums the shares; the passes decide
// which units share (dense, complete ones, in a synchronised backward).
#pragma once

#include <cstdint>
#include <string>

namespace strata::sharding {

// `strata plan`'s line for a pass that reduce-scatters (`unit`: what it reduces, "unit" or
// "bucket"), empty when a step has one micro-batch.
inline std::string describe_accumulation(const std::string& pass, const std::string& unit, bool reduce_every_micro_batch,
                                         int64_t micro_batches) {
  if (micro_batches < 2) return {};
  const std::string m = std::to_string(micro_batches);
  if (reduce_every_micro_batch)
    return pass + ": gradients: each of the " + m + " micro-batches reduce-scatters its share as each " + unit + "'s gradients are complete (" + m +
           " reductions per " + unit + " and step; split experts' " + unit + "s and held-back weight gradients reduce with a later share)";
  return pass + ": gradients: full gradients accumulate over the " + m +
         " micro-batches and are reduce-scattered once (reduce_every_micro_batch = true keeps no full gradient between them)";
}

}  // namespace strata::sharding
