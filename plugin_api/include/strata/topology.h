// Ranks laid out over the parallel dimensions of [parallel] (ATorch's parallel_mode), with the
// queries TorchDistPackage offers. Plugins ask it for groups; they never build groups themselves.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.h"

namespace strata {

enum class Dim { Data, Tensor, Pipeline, Context };
STRATA_API const char* dim_name(Dim dim);

class STRATA_API Topology {
 public:
  // sizes: the size of each dimension; order: dimension names innermost (adjacent ranks) first.
  Topology(std::map<Dim, int> sizes, std::vector<Dim> order, int rank);

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int size(Dim dim) const { return sizes_.at(dim); }
  // Ranks (global) of the group along `dim` that contains `rank`, in group order.
  std::vector<int> group_ranks(Dim dim, int rank) const;
  std::vector<int> group_ranks(Dim dim) const { return group_ranks(dim, rank_); }
  int rank_in(Dim dim) const;  // position of this rank in its `dim` group
  bool first_pipeline_stage() const { return rank_in(Dim::Pipeline) == 0; }
  bool last_pipeline_stage() const { return rank_in(Dim::Pipeline) == size(Dim::Pipeline) - 1; }
  int next_pipeline_rank() const;  // wraps around
  int previous_pipeline_rank() const;

  // The communicator of this rank's group along `dim`; world communicator when attached.
  void attach(std::shared_ptr<Communicator> world);
  Communicator& world() const;
  Communicator& group(Dim dim) const;

 private:
  std::map<Dim, int> sizes_;
  std::vector<Dim> order_;
  std::map<Dim, int> stride_;
  int world_size_, rank_;
  std::shared_ptr<Communicator> world_;
  std::map<Dim, std::shared_ptr<Communicator>> groups_;
};

}  // namespace strata
