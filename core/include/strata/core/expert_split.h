// Expert parallel at build time. While an ExpertSplitAtBuild scope is alive on this thread, every
// nn::GroupedLinear constructed draws all its experts (the generators move as in one process) and
// keeps only this rank's [index E/P, (index+1) E/P), as tensor-parallel layers keep their piece:
// an expert-parallel rank's build holds its experts plus one projection's worth of the others,
// never every expert of the model. build_rank_model opens the scope over Dim::Expert for the
// outline and the build, so the outline's absent blocks record the local shapes and placements a
// sharding pass plans on; the expert_parallel pass's split_experts then finds the experts kept.
#pragma once

#include "strata/nn.h"

namespace strata::nn {

class STRATA_API ExpertSplitAtBuild {
 public:
  explicit ExpertSplitAtBuild(TensorShard experts);
  ~ExpertSplitAtBuild();
  ExpertSplitAtBuild(const ExpertSplitAtBuild&) = delete;
  ExpertSplitAtBuild& operator=(const ExpertSplitAtBuild&) = delete;

 private:
  TensorShard outer_;
};

}  // namespace strata::nn
