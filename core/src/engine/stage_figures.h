// The model's own figures under a pipeline: each stage holds some of the model's modules, and a
// model figure is a sum by name over the modules that report it (nn::ReportsMetrics and
// nn::ReportsDeviceMetrics: an MoE layer reports its share of the mean over MoE layers, and its
// expert counts), so the whole model's figure is the sum over the stages. Rank 0, which writes
// metrics.jsonl, holds the first stage only; without this its MoE figures covered its own layers.
//
// The sum is taken when steps are read, never inside a step: `reduce` builds one matrix of the
// unread steps' figures, all-reduced over the pipeline group and read with the steps' other
// figures (one read); `decode` turns the read numbers back into named figures. Both sides of a
// sum must list the same names in the same order, so the names are agreed over the group the
// first time (two counted reads: their lengths, then their bytes). A rank that later reports a
// name not agreed (a module whose figures start later) says so in the matrix; every rank sees
// that in the read, and they agree anew and sum again.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "strata/comm.h"

namespace strata::engine {

class StageFigures {
 public:
  using Figures = std::vector<std::pair<std::string, at::Tensor>>;  // one-element tensors, any device
  using Named = std::vector<std::pair<std::string, double>>;

  StageFigures(Communicator& stages, at::Device device) : stages_(stages), device_(device) {}

  // [steps x (2 names + 1)]: per step each agreed name's local sum, whether this rank reported
  // it, and how many of its names are not agreed; summed over the stages (collective).
  at::Tensor reduce(const std::vector<Figures>& steps);
  // `read`: reduce's tensor as read. Per step, the names some stage reported, with their sums.
  // Agrees anew (collective, with reads of its own) where a rank reported a name not agreed.
  std::vector<Named> decode(const std::vector<double>& read, const std::vector<Figures>& steps);

 private:
  void agree(const std::vector<Figures>& steps);

  Communicator& stages_;
  at::Device device_;
  bool agreed_ = false;
  std::vector<std::string> names_;  // agreed over the stages, sorted
};

}  // namespace strata::engine
