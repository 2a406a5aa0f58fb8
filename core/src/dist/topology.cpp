#include "strata/topology.h"

#include <algorithm>
#include <stdexcept>

namespace strata {

const char* dim_name(Dim dim) {
  switch (dim) {
    case Dim::Data: return "data";
    case Dim::Tensor: return "tensor";
    case Dim::Pipeline: return "pipeline";
    case Dim::Context: return "context";
    case Dim::Expert: return "expert";
  }
  return "?";
}

Work::~Work() = default;
Communicator::~Communicator() = default;
CommunicatorBackend::~CommunicatorBackend() = default;

struct detail::TopologyState {
  std::map<Dim, int> sizes;
  std::vector<Dim> order;
  std::map<Dim, int> stride;
  int world_size = 1, rank = 0;
  std::shared_ptr<Communicator> world;
  std::map<unsigned, std::shared_ptr<Communicator>> groups;  // by effective mask
  std::shared_ptr<Communicator> expert_group, expert_data_group;  // with expert size > 1
};

Topology::~Topology() = default;
int Topology::world_size() const { return state_->world_size; }
int Topology::rank() const { return state_->rank; }
int Topology::size(Dim dim) const { return state_->sizes.at(dim); }

Topology::Topology(std::map<Dim, int> sizes, std::vector<Dim> order, int rank)
    : state_(std::make_unique<detail::TopologyState>(detail::TopologyState{std::move(sizes), std::move(order), {}, 1, rank, {}, {}, {}, {}})) {
  for (Dim d : state_->order) {
    if (d == Dim::Expert) throw std::invalid_argument("the expert dimension is a factor of data, not of the world");
    state_->stride[d] = state_->world_size;
    state_->world_size *= state_->sizes.at(d);
  }
  state_->sizes.emplace(Dim::Expert, 1);
  if (state_->sizes.at(Dim::Expert) < 1 || state_->sizes.at(Dim::Data) % state_->sizes.at(Dim::Expert) != 0)
    throw std::invalid_argument("expert size " + std::to_string(state_->sizes.at(Dim::Expert)) + " does not divide data size " +
                                std::to_string(state_->sizes.at(Dim::Data)));
  if (rank < 0 || rank >= state_->world_size) throw std::invalid_argument("rank outside the topology");
}

int Topology::size(const std::vector<Dim>& dims) const {
  int n = 1;
  for (Dim d : dims) n *= state_->sizes.at(d);
  return n;
}

std::vector<int> Topology::group_ranks(const std::vector<Dim>& dims, int rank) const {
  if (std::find(dims.begin(), dims.end(), Dim::Expert) != dims.end()) {
    if (dims.size() != 1) throw std::invalid_argument("the expert dimension makes groups on its own");
    return expert_ranks(rank, /*same_experts=*/false);
  }
  // Walk every combination of coordinates along `dims`, keeping the others of `rank`.
  int base = rank;
  for (Dim d : dims) base -= (rank / state_->stride.at(d) % state_->sizes.at(d)) * state_->stride.at(d);
  std::vector<int> out{base};
  for (Dim d : dims) {
    std::vector<int> grown;
    for (int r : out)
      for (int k = 0; k < state_->sizes.at(d); ++k) grown.push_back(r + k * state_->stride.at(d));
    out = std::move(grown);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Data coordinate c = replica x E + expert coordinate: the expert group of a rank is its data
// group's ranks with its replica index, the expert-data group those with its expert coordinate.
std::vector<int> Topology::expert_ranks(int rank, bool same_experts) const {
  const int experts = state_->sizes.at(Dim::Expert);
  const std::vector<int> data = group_ranks(Dim::Data, rank);
  const int c = static_cast<int>(std::find(data.begin(), data.end(), rank) - data.begin());
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(data.size()); ++i)
    if (same_experts ? i % experts == c % experts : i / experts == c / experts) out.push_back(data[static_cast<size_t>(i)]);
  return out;
}

int Topology::rank_in(Dim dim) const {
  if (dim == Dim::Expert) return rank_in(Dim::Data) % state_->sizes.at(Dim::Expert);
  return state_->rank / state_->stride.at(dim) % state_->sizes.at(dim);
}

int Topology::rank_in(const std::vector<Dim>& dims) const {
  const std::vector<int> ranks = group_ranks(dims, state_->rank);
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), state_->rank) - ranks.begin());
}

int Topology::neighbour(Dim dim, int offset) const {
  const int n = size(dim);
  const int position = ((rank_in(dim) + offset) % n + n) % n;
  return group_ranks(dim)[static_cast<size_t>(position)];
}

unsigned Topology::effective_mask(const std::vector<Dim>& dims) const {
  unsigned mask = 0;
  for (Dim d : dims)
    if (state_->sizes.at(d) > 1) mask |= 1u << static_cast<unsigned>(d);
  return mask;
}

void Topology::attach(std::shared_ptr<Communicator> world) {
  if (world->size() != state_->world_size)
    throw std::invalid_argument("the communicator has " + std::to_string(world->size()) + " ranks, the topology " +
                                std::to_string(state_->world_size));
  state_->world = std::move(world);
  // One communicator per distinct set of dimensions larger than one; every rank creates them in
  // the same (ascending mask) order, as split() is collective.
  const std::vector<Dim> all{Dim::Data, Dim::Tensor, Dim::Pipeline, Dim::Context};
  const unsigned full = effective_mask(all);
  for (unsigned mask = 0; mask <= full; ++mask) {
    if ((mask & full) != mask) continue;
    std::vector<Dim> dims;
    for (Dim d : all)
      if (mask & (1u << static_cast<unsigned>(d))) dims.push_back(d);
    state_->groups[mask] = mask == full ? state_->world : state_->world->split(group_ranks(dims, state_->rank));
  }
  if (state_->sizes.at(Dim::Expert) > 1) {
    state_->expert_group = state_->world->split(expert_ranks(state_->rank, false));
    state_->expert_data_group = state_->world->split(expert_ranks(state_->rank, true));
  }
}

Communicator& Topology::world() const {
  if (!state_->world) throw std::logic_error("no communicator attached to the topology");
  return *state_->world;
}

Communicator& Topology::group(const std::vector<Dim>& dims) const {
  if (!state_->world) throw std::logic_error("no communicator attached to the topology");
  if (std::find(dims.begin(), dims.end(), Dim::Expert) != dims.end()) {
    if (dims.size() != 1) throw std::invalid_argument("the expert dimension makes groups on its own");
    return state_->expert_group ? *state_->expert_group : *state_->groups.at(0);
  }
  return *state_->groups.at(effective_mask(dims));
}

Communicator& Topology::expert_data_group() const {
  if (!state_->world) throw std::logic_error("no communicator attached to the topology");
  return state_->expert_data_group ? *state_->expert_data_group : group(Dim::Data);
}

std::vector<int> Topology::expert_data_ranks(int rank) const { return expert_ranks(rank, /*same_experts=*/true); }

}  // namespace strata
