#include "snapshot_replicas.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "fault_injection.h"
#include "strata/core/log.h"
#include "strata/errors.h"

namespace strata {

std::string replica_nodes_problem(int64_t nodes, int64_t replicas) {
  if (replicas <= nodes - 1) return {};
  return "[job] snapshot_replicas = " + std::to_string(replicas) + " needs " + std::to_string(replicas + 1) +
         " nodes or more; this job's ranks are on " + std::to_string(nodes) + " node" + (nodes == 1 ? "" : "s");
}

std::vector<std::vector<int>> replica_receivers(const std::vector<int64_t>& node_of, int64_t replicas) {
  std::vector<int64_t> nodes(node_of);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  const auto count = static_cast<int64_t>(nodes.size());
  if (const std::string why = replica_nodes_problem(count, replicas); !why.empty())
    throw UserError(why + " (on one machine: strata run -n N --simulate-nodes K)");
  std::vector<std::vector<int>> members(nodes.size());
  for (size_t r = 0; r < node_of.size(); ++r)
    members[static_cast<size_t>(std::lower_bound(nodes.begin(), nodes.end(), node_of[r]) - nodes.begin())].push_back(static_cast<int>(r));
  std::vector<std::vector<int>> receivers(node_of.size());
  for (int64_t k = 0; k < count; ++k)
    for (size_t i = 0; i < members[static_cast<size_t>(k)].size(); ++i)
      for (int64_t j = 1; j <= replicas; ++j) {
        const auto& peer_node = members[static_cast<size_t>((k + j) % count)];
        receivers[static_cast<size_t>(members[static_cast<size_t>(k)][i])].push_back(peer_node[i % peer_node.size()]);
      }
  return receivers;
}

namespace engine {

namespace {

constexpr int kImageTag = 2, kChecksumTag = 3;
constexpr int64_t kHashWords = 16;  // the state hash (64 hex digits), 4 bytes a word: exact as a double
constexpr int64_t kIdentityWords = 3 + kHashWords;  // step, world size, image bytes, state hash

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out.empty() ? "none" : out;
}

}  // namespace


// One sender's replica on its way: where its bytes go (a slot, or a scratch buffer when the slot
// is held by the supervisor and the bytes must still be taken off the wire).
struct SnapshotReplicas::Incoming {
  int sender = 0;
  FlashReceive slot;
  at::Tensor buffer;  // on the communicator's device
  uint64_t checksum = 0;  // the sender's, once it has arrived
};

std::vector<int64_t> nodes_of_ranks(Communicator& world, int node, c10::Device device) {
  std::vector<int64_t> nodes(static_cast<size_t>(world.size()), 0);
  nodes[static_cast<size_t>(world.rank())] = node;
  at::Tensor all = at::tensor(nodes, at::kLong).to(device);
  world.all_reduce(all, ReduceOp::Sum)->wait();
  all = all.cpu();
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + world.size()};
}

SnapshotReplicas::SnapshotReplicas(Communicator& world, int node, int64_t replicas, const std::filesystem::path& store, c10::Device device)
    : device_(device) {
  const auto receivers = replica_receivers(nodes_of_ranks(world, node, device), replicas);
  receivers_ = receivers[static_cast<size_t>(world.rank())];
  for (int s = 0; s < world.size(); ++s)
    for (int r : receivers[static_cast<size_t>(s)])
      if (r == world.rank()) senders_.push_back(s);
  std::vector<int> everyone(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) everyone[static_cast<size_t>(r)] = r;
  channel_ = world.split(everyone);
  for (int s : senders_) replica_slots_[s] = std::make_unique<FlashWriter>(store, s);
  log::record("snapshot replicas: " + describe());
}

SnapshotReplicas::~SnapshotReplicas() = default;

std::string SnapshotReplicas::describe() const {
  return "rank " + std::to_string(channel_ ? channel_->rank() : -1) + " sends its images to rank(s) " + rank_list(receivers_) +
         " and holds those of rank(s) " + rank_list(senders_);
}

std::vector<int64_t> SnapshotReplicas::identity_rows(FlashWriter& own, bool written) const {
  std::vector<int64_t> rows(static_cast<size_t>(channel_->size() * kIdentityWords), 0);
  const std::optional<FlashImageView> mine = written ? own.newest(/*with_checksum=*/false) : std::nullopt;
  if (!mine) return rows;
  if (mine->info.state_hash.size() > kHashWords * 4) throw std::logic_error("snapshot replicas: a state hash longer than 64 characters");
  int64_t* row = rows.data() + channel_->rank() * kIdentityWords;
  row[0] = mine->info.step, row[1] = mine->info.world_size, row[2] = static_cast<int64_t>(mine->image.size());
  for (size_t i = 0; i < mine->info.state_hash.size(); ++i)
    row[3 + i / 4] |= static_cast<int64_t>(static_cast<unsigned char>(mine->info.state_hash[i])) << (8 * (i % 4));
  return rows;
}

void SnapshotReplicas::announce(const std::vector<double>& rows) {
  if (rows.size() != static_cast<size_t>(channel_->size() * kIdentityWords)) throw std::logic_error("snapshot replicas: identity rows of another world");
  check_received();  // first: a replica whose check has not started holds its slot in no state a new one respects
  for (int s : senders_) {
    const double* row = rows.data() + s * kIdentityWords;
    std::string hash;
    for (int64_t i = 0; i < kHashWords * 4; ++i)
      if (const auto c = static_cast<char>((static_cast<uint64_t>(row[3 + i / 4]) >> (8 * (i % 4))) & 0xff); c != '\0') hash += c;
    const auto step = static_cast<int64_t>(row[0]), world_size = static_cast<int64_t>(row[1]), bytes = static_cast<int64_t>(row[2]);
    auto in = std::make_unique<Incoming>();
    in->sender = s;
    std::string problem;
    in->slot = replica_slots_.at(s)->begin_receive({step, world_size, hash}, static_cast<uint64_t>(bytes), problem);
    if (!problem.empty()) log::record("snapshot replicas: cannot hold rank " + std::to_string(s) + "'s image: " + problem);
    in->buffer = in->slot.image && device_.is_cpu() ? at::from_blob(in->slot.image, {bytes}, at::kByte)
                                                     : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    incoming_.push_back(std::move(in));
  }
  announced_ = true;
}

void SnapshotReplicas::post(FlashWriter& own) {
  if (!announced_) throw std::logic_error("snapshot replicas: an image posted before it was announced");
  const std::optional<FlashImageView> mine = own.newest(/*with_checksum=*/false);
  if (!mine) throw std::logic_error("snapshot replicas: no snapshot to send");
  at::Tensor image = at::from_blob(const_cast<char*>(mine->image.data()), {static_cast<int64_t>(mine->image.size())}, at::kByte);
  if (!device_.is_cpu()) image = image.to(device_);  // staged: device communicators send device memory
  // Sends and receives in one batch: NCCL runs a communicator's messages in order on one stream,
  // so a receive posted alone before the send would wait for a send queued behind it.
  std::vector<P2POp> messages;
  for (int r : receivers_) messages.push_back({P2POp::Kind::Send, image, r, kImageTag});
  for (auto& in : incoming_) messages.push_back({P2POp::Kind::Recv, in->buffer, in->sender, kImageTag});
  in_flight_.push_back(channel_->batch_p2p(std::move(messages)));
  outgoing_.push_back(image);
  inject_fault(channel_->rank(), mine->info.step, "replica");
}

void SnapshotReplicas::check_received() {
  for (auto& in : arrived_) replica_slots_.at(in->sender)->check_newest_receive();
  arrived_.clear();
}

void SnapshotReplicas::complete(FlashWriter& own) {
  if (!announced_) return;
  for (auto& work : in_flight_) work->wait();
  in_flight_.clear();
  outgoing_.clear();
  const std::optional<FlashImageView> mine = own.newest(/*with_checksum=*/true);
  uint64_t checksum = mine ? mine->checksum : 0;
  at::Tensor sum = at::tensor(std::vector<int64_t>{0}, at::kLong);
  std::memcpy(sum.data_ptr<int64_t>(), &checksum, sizeof checksum);
  sum = sum.to(device_);
  at::Tensor theirs = at::empty({static_cast<int64_t>(incoming_.size())}, at::TensorOptions().dtype(at::kLong).device(device_));
  std::vector<P2POp> messages;  // one batch, as the images (NCCL's order on one stream)
  for (int r : receivers_) messages.push_back({P2POp::Kind::Send, sum, r, kChecksumTag});
  for (size_t i = 0; i < incoming_.size(); ++i)
    messages.push_back({P2POp::Kind::Recv, theirs.narrow(0, static_cast<int64_t>(i), 1), incoming_[i]->sender, kChecksumTag});
  channel_->batch_p2p(std::move(messages))->wait();
  theirs = theirs.cpu();
  for (size_t i = 0; i < incoming_.size(); ++i) {
    auto& in = incoming_[i];
    std::memcpy(&in->checksum, theirs.data_ptr<int64_t>() + i, sizeof in->checksum);
    if (!in->slot.image) continue;
    if (!device_.is_cpu()) std::memcpy(in->slot.image, in->buffer.cpu().data_ptr(), static_cast<size_t>(in->buffer.numel()));
    replica_slots_.at(in->sender)->finish_receive(in->slot, in->checksum);  // complete: it counts from now
    arrived_.push_back(std::move(in));
  }
  incoming_.clear();
  announced_ = false;
}

void SnapshotReplicas::discard_after(int64_t step) {
  for (auto& [sender, slots] : replica_slots_) slots->discard_after(step);
}

}  // namespace engine
}  // namespace strata
