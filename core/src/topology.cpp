#include "strata/topology.h"

#include <stdexcept>

namespace strata {

const char* dim_name(Dim dim) {
  switch (dim) {
    case Dim::Data: return "data";
    case Dim::Tensor: return "tensor";
    case Dim::Pipeline: return "pipeline";
    case Dim::Context: return "context";
  }
  return "?";
}

Work::~Work() = default;
Communicator::~Communicator() = default;
CommunicatorBackend::~CommunicatorBackend() = default;

Topology::Topology(std::map<Dim, int> sizes, std::vector<Dim> order, int rank)
    : sizes_(std::move(sizes)), order_(std::move(order)), world_size_(1), rank_(rank) {
  for (Dim d : order_) {
    stride_[d] = world_size_;
    world_size_ *= sizes_.at(d);
  }
  if (rank < 0 || rank >= world_size_) throw std::invalid_argument("rank outside the topology");
}

std::vector<int> Topology::group_ranks(Dim dim, int rank) const {
  const int stride = stride_.at(dim), size = sizes_.at(dim);
  const int base = rank - (rank / stride % size) * stride;
  std::vector<int> out;
  for (int k = 0; k < size; ++k) out.push_back(base + k * stride);
  return out;
}

int Topology::rank_in(Dim dim) const { return rank_ / stride_.at(dim) % sizes_.at(dim); }

int Topology::next_pipeline_rank() const {
  auto ranks = group_ranks(Dim::Pipeline);
  return ranks[static_cast<size_t>((rank_in(Dim::Pipeline) + 1) % size(Dim::Pipeline))];
}

int Topology::previous_pipeline_rank() const {
  auto ranks = group_ranks(Dim::Pipeline);
  return ranks[static_cast<size_t>((rank_in(Dim::Pipeline) + size(Dim::Pipeline) - 1) % size(Dim::Pipeline))];
}

void Topology::attach(std::shared_ptr<Communicator> world) {
  if (world->size() != world_size_)
    throw std::invalid_argument("the communicator has " + std::to_string(world->size()) + " ranks, the topology " +
                                std::to_string(world_size_));
  world_ = std::move(world);
  // Every rank creates its groups in the same order, as split() is collective.
  for (Dim d : {Dim::Tensor, Dim::Context, Dim::Pipeline, Dim::Data}) groups_[d] = world_->split(group_ranks(d));
}

Communicator& Topology::world() const {
  if (!world_) throw std::logic_error("no communicator attached to the topology");
  return *world_;
}

Communicator& Topology::group(Dim dim) const {
  if (!world_) throw std::logic_error("no communicator attached to the topology");
  return *groups_.at(dim);
}

}  // namespace strata
