// Ranks laid out over the parallel dimensions of [parallel] (ATorch's parallel_mode), with the
// queries TorchDistPackage offers. Plugins ask it for groups; they never build groups themselves.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/claims.h"
#include "strata/comm.h"

namespace strata {

namespace detail {
struct TopologyState;  // the class's state, defined in core
}  // namespace detail

class STRATA_API Topology {
 public:
  // sizes: the size of each dimension; order: dimension names innermost (adjacent ranks) first.
  Topology(std::map<Dim, int> sizes, std::vector<Dim> order, int rank);

  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int world_size() const;
  int rank() const;
  int size(Dim dim) const;
  // The product of the sizes of `dims`.
  int size(const std::vector<Dim>& dims) const;
  // Ranks (global, ascending) of the group spanning `dims` that contains `rank`: the ranks whose
  // coordinates agree with it on every other dimension. Several dims give a flattened group
  // (data x context reduces gradients).
  std::vector<int> group_ranks(const std::vector<Dim>& dims, int rank) const;
  std::vector<int> group_ranks(Dim dim, int rank) const { return group_ranks(std::vector<Dim>{dim}, rank); }
  std::vector<int> group_ranks(Dim dim) const { return group_ranks(dim, rank()); }
  int rank_in(Dim dim) const;  // this rank's coordinate along `dim` (its position in that group)
  int rank_in(const std::vector<Dim>& dims) const;  // its position in the flattened group
  // The global rank `offset` steps along `dim` from this one, wrapping within the group
  // (ring neighbours: +1 and -1).
  int neighbour(Dim dim, int offset) const;
  bool first_pipeline_stage() const { return rank_in(Dim::Pipeline) == 0; }
  bool last_pipeline_stage() const { return rank_in(Dim::Pipeline) == size(Dim::Pipeline) - 1; }
  int next_pipeline_rank() const { return neighbour(Dim::Pipeline, 1); }
  int previous_pipeline_rank() const { return neighbour(Dim::Pipeline, -1); }

  // The data ranks that hold the same experts as `rank` (its expert coordinate, every replica):
  // they average the experts' gradients (Megatron's expert-data-parallel group). Without expert
  // parallel, the data group.
  std::vector<int> expert_data_ranks(int rank) const;
  Communicator& expert_data_group() const;

  // Creates the communicator of every group (collective: every rank attaches in step).
  void attach(std::shared_ptr<Communicator> world);
  Communicator& world() const;
  // The communicator of this rank's group along `dim`, or spanning several dims.
  Communicator& group(Dim dim) const { return group(std::vector<Dim>{dim}); }
  Communicator& group(const std::vector<Dim>& dims) const;

 private:
  // Dimensions of size > 1 among `dims`, as a bit set: groups over equal sets are the same.
  unsigned effective_mask(const std::vector<Dim>& dims) const;
  // The expert group of `rank` (same_experts false) or its expert-data group (true).
  std::vector<int> expert_ranks(int rank, bool same_experts) const;

  // Sizes, strides and communicators live in core (one pointer here): the size never changes.
  std::unique_ptr<detail::TopologyState> state_;
};

}  // namespace strata
