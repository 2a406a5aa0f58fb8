// The routed experts' place in tune's cost estimate (strata/cost.h), shared by expert_parallel,
// which keeps 1/P of them on a rank, and the data-parallel passes, which reduce, shard and
// gather them over the expert-data group (the D/P data ranks holding the same experts) while
// the rest of the model goes over all D data ranks. A mixture-of-experts layer every
// [model] moe_every layers holds n_experts SwiGLU experts of 3 d ffn parameters each.
// Header only: expert_parallel does not link the sharding library.
#pragma once

#include <algorithm>

#include "strata/config.h"
#include "strata/cost.h"
#include "strata/pass.h"

namespace strata::sharding {

struct ExpertSplit {
  double share = 0;  // the routed experts' share of the whole model's parameters
  double ranks = 1;  // P, the expert-parallel size
  // A rank's parameters against the whole model's: all but (P-1)/P of the experts.
  double kept() const { return 1 - share * (1 - 1 / ranks); }
  // The split experts' share of a rank's parameters (and so of its weights, gradients and
  // optimizer state as the estimate holds them once expert_parallel estimated): 0 without
  // expert parallel.
  double fraction() const { return ranks > 1 ? share / ranks / kept() : 0; }
};

// What one rank sends of a ring collective's buffer over `ranks` ranks: (g-1)/g of it per
// all-gather or reduce-scatter (an all-reduce is both).
inline double ring_share(double ranks) { return ranks > 1 ? (ranks - 1) / ranks : 0; }

// The same for a buffer of a rank's parameters collected over the data group: the split experts'
// part over their expert-data group of data/P ranks instead.
inline double data_ring_share(const ExpertSplit& split, double data) {
  const double experts = split.fraction();
  return (1 - experts) * ring_share(data) + experts * ring_share(data / split.ranks);
}

inline ExpertSplit expert_split(const PlanFacts& facts, const CostEstimate& c) {
  ExpertSplit split;
  if (facts.mesh.expert <= 1 || c.model.parameters <= 0 || !facts.model.has("n_experts")) return split;
  const double d = static_cast<double>(c.model.hidden), ffn = static_cast<double>(c.model.ffn_hidden);
  const int64_t moe_every = std::max<int64_t>(1, facts.model.has("moe_every") ? facts.model.get_int("moe_every") : 1);
  const double moe_layers = static_cast<double>(facts.model.get_int("n_layer") / moe_every);
  const double experts = static_cast<double>(facts.model.get_int("n_experts"));
  split.share = std::min(1.0, moe_layers * experts * 3 * d * ffn / static_cast<double>(c.model.parameters));
  split.ranks = static_cast<double>(facts.mesh.expert);
  return split;
}

}  // namespace strata::sharding
