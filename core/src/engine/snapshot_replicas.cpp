#include "snapshot_replicas.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "fault_injection.h"
#include "metrics.h"
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

constexpr int kImageTag = 2;
constexpr int64_t kHashWords = 16;  // the state hash (64 hex digits), 4 bytes a word
// A rank's row of the agreement: its new image's step, world size, bytes and state hash; then
// whether it sent an image whose checksum its receivers still wait for, and that checksum in two
// 32-bit halves. Every word stays below 2^53, so the sum and its read as doubles are exact.
constexpr int64_t kStep = 0, kWorldSize = 1, kBytes = 2, kHash = 3, kSent = kHash + kHashWords, kChecksumLow = kSent + 1,
                  kChecksumHigh = kSent + 2, kRowWords = kSent + 3;

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

void SnapshotReplicas::complete(FlashWriter& own) {
  for (auto& work : in_flight_) work->wait();
  in_flight_.clear();
  outgoing_.clear();
  if (!sent_) return;
  // The image sent is still the newest: this runs before the next one is written. Its checksum
  // was computed in the background since.
  const std::optional<FlashImageView> mine = own.newest(/*with_checksum=*/true);
  sent_checksum_ = mine ? mine->checksum : 0;
}

std::vector<int64_t> SnapshotReplicas::agreement_rows(FlashWriter& own, bool written) const {
  std::vector<int64_t> rows(static_cast<size_t>(channel_->size() * kRowWords), 0);
  int64_t* row = rows.data() + channel_->rank() * kRowWords;
  if (sent_) row[kSent] = 1, row[kChecksumLow] = static_cast<int64_t>(sent_checksum_ & 0xffffffffu), row[kChecksumHigh] = static_cast<int64_t>(sent_checksum_ >> 32);
  const std::optional<FlashImageView> mine = written ? own.newest(/*with_checksum=*/false) : std::nullopt;
  if (!mine) return rows;
  if (mine->info.state_hash.size() > kHashWords * 4) throw std::logic_error("snapshot replicas: a state hash longer than 64 characters");
  row[kStep] = mine->info.step, row[kWorldSize] = mine->info.world_size, row[kBytes] = static_cast<int64_t>(mine->image.size());
  for (size_t i = 0; i < mine->info.state_hash.size(); ++i)
    row[kHash + static_cast<int64_t>(i / 4)] |= static_cast<int64_t>(static_cast<unsigned char>(mine->info.state_hash[i])) << (8 * (i % 4));
  return rows;
}

void SnapshotReplicas::agreed(const std::vector<double>& rows, bool announce) {
  if (rows.size() != static_cast<size_t>(channel_->size() * kRowWords)) throw std::logic_error("snapshot replicas: agreement rows of another world");
  auto word = [&](int rank, int64_t index) { return static_cast<int64_t>(rows[static_cast<size_t>(rank * kRowWords + index)]); };
  // The images received since the last agreement: complete, and their senders' checksums here.
  for (auto& in : incoming_) {
    if (word(in->sender, kSent) != 1) throw std::logic_error("snapshot replicas: rank " + std::to_string(in->sender) + " sent no checksum");
    if (!in->slot.image) continue;
    const auto checksum = static_cast<uint64_t>(word(in->sender, kChecksumLow)) | static_cast<uint64_t>(word(in->sender, kChecksumHigh)) << 32;
    if (!device_.is_cpu()) std::memcpy(in->slot.image, in->buffer.cpu().data_ptr(), static_cast<size_t>(in->buffer.numel()));
    replica_slots_.at(in->sender)->finish_receive(in->slot, checksum);  // complete: it counts from now
    arrived_.push_back(std::move(in));
  }
  incoming_.clear();
  sent_ = false;  // this rank's receivers have its checksum: the same rows
  if (!announce) return;
  check_received();  // first: a replica whose check has not started holds its slot in no state a new one respects
  for (int s : senders_) {
    std::string hash;
    for (int64_t i = 0; i < kHashWords * 4; ++i)
      if (const auto c = static_cast<char>((static_cast<uint64_t>(word(s, kHash + i / 4)) >> (8 * (i % 4))) & 0xff); c != '\0') hash += c;
    const int64_t bytes = word(s, kBytes);
    auto in = std::make_unique<Incoming>();
    in->sender = s;
    std::string problem;
    in->slot = replica_slots_.at(s)->begin_receive({word(s, kStep), word(s, kWorldSize), hash}, static_cast<uint64_t>(bytes), problem);
    if (!problem.empty()) log::record("snapshot replicas: cannot hold rank " + std::to_string(s) + "'s image: " + problem);
    in->buffer = in->slot.image && device_.is_cpu() ? at::from_blob(in->slot.image, {bytes}, at::kByte)
                                                     : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    incoming_.push_back(std::move(in));
  }
  announced_ = true;
}

void SnapshotReplicas::post(FlashWriter& own) {
  if (!announced_) throw std::logic_error("snapshot replicas: an image posted before it was announced");
  announced_ = false;
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
  sent_ = !receivers_.empty();
  inject_fault(channel_->rank(), mine->info.step, "replica");
}

void SnapshotReplicas::finish(FlashWriter& own) {
  complete(own);
  const std::vector<int64_t> mine = agreement_rows(own, /*written=*/false);
  at::Tensor rows = at::tensor(mine, at::kLong).to(device_);
  channel_->all_reduce(rows, ReduceOp::Sum)->wait();
  agreed(read_on_host({rows}), /*announce=*/false);
  check_received();
}

void SnapshotReplicas::check_received() {
  for (auto& in : arrived_) replica_slots_.at(in->sender)->check_newest_receive();
  arrived_.clear();
}

void SnapshotReplicas::discard_after(int64_t step) {
  for (auto& [sender, slots] : replica_slots_) slots->discard_after(step);
}

}  // namespace engine
}  // namespace strata
