#include "strata/core/flight_recorder.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

namespace strata {

namespace {

int64_t payload_bytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0; }

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ranks[i]);
  }
  return out;
}

uint64_t members_hash(const std::vector<int>& ranks) {  // FNV-1a over the global ranks
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks)
    for (int b = 0; b < 4; ++b) h = (h ^ ((static_cast<uint32_t>(r) >> (8 * b)) & 0xff)) * 1099511628211ull;
  return h;
}

// Marks its operation done in the flight record when wait() first returns.
class RecordedWork final : public Work {
 public:
  RecordedWork(WorkPtr inner, ProgressBeacon& beacon, int64_t ticket) : inner_(std::move(inner)), beacon_(beacon), ticket_(ticket) {}
  void wait() override {
    inner_->wait();
    if (!done_) beacon_.collective_done(ticket_), done_ = true;
  }

 private:
  WorkPtr inner_;
  ProgressBeacon& beacon_;
  int64_t ticket_;
  bool done_ = false;
};

// The beacon outlives the communicators: both live in the Trainer (trainer_impl.h), the beacon declared first.
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(std::shared_ptr<Communicator> inner, ProgressBeacon& beacon, std::vector<int> global_ranks)
      : inner_(std::move(inner)), beacon_(beacon), global_ranks_(std::move(global_ranks)) {
    group_ = beacon_.add_group(ranks_text(global_ranks_), members_hash(global_ranks_), static_cast<int>(global_ranks_.size()));
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op) override {
    return collective(CollectiveOp::AllReduce, payload_bytes(tensor), [&] { return inner_->all_reduce(tensor, op); });
  }
  WorkPtr reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override {
    return collective(CollectiveOp::ReduceScatter, payload_bytes(input), [&] { return inner_->reduce_scatter(output, input, op); });
  }
  WorkPtr all_gather(at::Tensor output, at::Tensor input) override {
    return collective(CollectiveOp::AllGather, payload_bytes(input), [&] { return inner_->all_gather(output, input); });
  }
  WorkPtr broadcast(at::Tensor tensor, int root) override {
    return collective(CollectiveOp::Broadcast, payload_bytes(tensor), [&] { return inner_->broadcast(tensor, root); });
  }
  WorkPtr all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) override {
    return collective(CollectiveOp::AllToAll, payload_bytes(input),
                      [&] { return inner_->all_to_all(output, input, std::move(output_splits), std::move(input_splits)); });
  }
  WorkPtr barrier() override { return collective(CollectiveOp::Barrier, 0, [&] { return inner_->barrier(); }); }
  WorkPtr send(at::Tensor tensor, int peer, int tag) override {
    return point_to_point(CollectiveOp::Send, payload_bytes(tensor), peer, [&] { return inner_->send(tensor, peer, tag); });
  }
  WorkPtr recv(at::Tensor tensor, int peer, int tag) override {
    return point_to_point(CollectiveOp::Recv, payload_bytes(tensor), peer, [&] { return inner_->recv(tensor, peer, tag); });
  }
  WorkPtr batch_p2p(std::vector<P2POp> ops) override {
    int64_t bytes = 0;
    for (const auto& op : ops) bytes += payload_bytes(op.tensor);
    const int peer = ops.size() == 1 ? ops.front().peer : -1;
    return point_to_point(CollectiveOp::BatchP2P, bytes, peer, [&] { return inner_->batch_p2p(std::move(ops)); });
  }
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    std::vector<int> global;
    for (int r : ranks) global.push_back(global_ranks_.at(static_cast<size_t>(r)));
    return std::make_shared<RecordingCommunicator>(inner_->split(ranks), beacon_, std::move(global));
  }

  void label(const std::string& what) { beacon_.rename_group(group_, what + ": " + ranks_text(global_ranks_)); }

 private:
  template <class Issue>
  WorkPtr collective(CollectiveOp op, int64_t bytes, Issue issue) {
    const int64_t ticket = beacon_.collective_issued(group_, ++collectives_, op, bytes, -1, true);
    return std::make_shared<RecordedWork>(issue(), beacon_, ticket);
  }
  template <class Issue>
  WorkPtr point_to_point(CollectiveOp op, int64_t bytes, int peer, Issue issue) {
    const int global_peer = peer >= 0 && peer < static_cast<int>(global_ranks_.size()) ? global_ranks_[static_cast<size_t>(peer)] : -1;
    const int64_t ticket = beacon_.collective_issued(group_, ++messages_, op, bytes, global_peer, false);
    return std::make_shared<RecordedWork>(issue(), beacon_, ticket);
  }

  std::shared_ptr<Communicator> inner_;
  ProgressBeacon& beacon_;
  std::vector<int> global_ranks_;
  int group_ = -1;
  std::atomic<int64_t> collectives_{0}, messages_{0};
};

// One rank's flight record, decoded.
struct RankFlight {
  std::map<std::pair<uint64_t, int>, int> group_index;  // (members hash, ordinal) -> table index
  std::vector<CollectiveRecord> entries;                // valid ring entries, oldest first
};

RankFlight decode(const ProgressFile& file) {
  RankFlight out;
  const int groups = std::clamp(file.progress.groups, 0, kFlightGroups);
  for (int g = 0; g < groups; ++g) out.group_index[{file.groups[g].members_hash, file.groups[g].ordinal}] = g;
  for (const CollectiveRecord& e : file.flight)
    if (e.seq > 0 && e.group >= 0 && e.group < groups) out.entries.push_back(e);
  std::sort(out.entries.begin(), out.entries.end(), [](const auto& a, const auto& b) { return a.issued_ns < b.issued_ns; });
  return out;
}

std::string group_name(const ProgressFile& file, int group) {
  return std::string(file.groups[group].name, strnlen(file.groups[group].name, sizeof file.groups[group].name));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

std::string op_text(const CollectiveRecord& e) { return collective_op_name(static_cast<CollectiveOp>(e.op)); }

// The newest collective number a rank issued on a group (0: none recorded; -1: not a member).
int64_t newest_collective(const RankFlight& f, std::pair<uint64_t, int> group_key) {
  auto it = f.group_index.find(group_key);
  if (it == f.group_index.end()) return -1;
  int64_t last = 0;
  for (const auto& e : f.entries)
    if (e.collective && e.group == it->second) last = std::max(last, e.seq);
  return last;
}

// A rank's entry for collective `seq` of a group, or nullptr.
const CollectiveRecord* collective_entry(const RankFlight& f, std::pair<uint64_t, int> group_key, int64_t seq) {
  auto it = f.group_index.find(group_key);
  if (it == f.group_index.end()) return nullptr;
  for (const auto& e : f.entries)
    if (e.collective && e.group == it->second && e.seq == seq) return &e;
  return nullptr;
}

}  // namespace

std::shared_ptr<Communicator> record_collectives(std::shared_ptr<Communicator> world, ProgressBeacon& beacon) {
  if (!beacon.recording()) return world;
  std::vector<int> ranks(static_cast<size_t>(world->size()));
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  auto recorded = std::make_shared<RecordingCommunicator>(std::move(world), beacon, std::move(ranks));
  recorded->label("world");
  return recorded;
}

void label_group(Communicator& group, const std::string& label) {
  if (auto* recorded = dynamic_cast<RecordingCommunicator*>(&group)) recorded->label(label);
}

CollectiveDiagnosis diagnose_collectives(const std::vector<ProgressFile>& files, const std::vector<bool>& present) {
  const int ranks = static_cast<int>(files.size());
  std::vector<RankFlight> flights(files.size());
  for (int r = 0; r < ranks; ++r)
    if (present[static_cast<size_t>(r)]) flights[static_cast<size_t>(r)] = decode(files[static_cast<size_t>(r)]);
  // What each rank waits in: its oldest operation not completed (backends complete in issue order).
  std::vector<const CollectiveRecord*> waiting(files.size(), nullptr);
  for (int r = 0; r < ranks; ++r)
    for (const auto& e : flights[static_cast<size_t>(r)].entries)
      if (e.done_ns == 0) {
        waiting[static_cast<size_t>(r)] = &e;
        break;
      }
  auto key_of = [&](int r, const CollectiveRecord& e) {
    const FlightGroup& g = files[static_cast<size_t>(r)].groups[e.group];
    return std::make_pair(g.members_hash, static_cast<int>(g.ordinal));
  };
  auto last_collective = [&](int m, std::pair<uint64_t, int> key) { return newest_collective(flights[static_cast<size_t>(m)], key); };
  auto entry_for = [&](int m, std::pair<uint64_t, int> key, int64_t seq) { return collective_entry(flights[static_cast<size_t>(m)], key, seq); };
  auto step_of = [&](int m) { return files[static_cast<size_t>(m)].progress.step; };

  // 1. Ranks waiting in a collective that a member of its group never issued; the blamed ranks
  //    that wait in nothing themselves are the root (the others wait on them in turn).
  std::optional<CollectiveDiagnosis> mismatch, all_issued;
  for (int r = 0; r < ranks; ++r) {
    const CollectiveRecord* w = waiting[static_cast<size_t>(r)];
    if (!w) continue;
    const auto key = key_of(r, *w);
    const std::string name = group_name(files[static_cast<size_t>(r)], w->group);
    if (!w->collective) {
      const int peer = w->peer;
      if (peer < 0 || peer >= ranks || waiting[static_cast<size_t>(peer)] || !present[static_cast<size_t>(peer)]) continue;
      CollectiveDiagnosis d;
      d.culprits = {peer};
      d.cause = "rank " + std::to_string(peer) + " waits in no operation (at step " + std::to_string(step_of(peer)) + ") while rank " +
                std::to_string(r) + " waits in " + op_text(*w) + (w->op == static_cast<int32_t>(CollectiveOp::Send) ? " to" : " from") +
                " it on group \"" + name + "\"";
      return d;
    }
    std::vector<int> waiters, behind, idle_behind, wrong;
    for (int m = 0; m < ranks; ++m) {
      if (!present[static_cast<size_t>(m)]) continue;
      const int64_t last = last_collective(m, key);
      if (last < 0) continue;
      const CollectiveRecord* mw = waiting[static_cast<size_t>(m)];
      if (mw && mw->collective && key_of(m, *mw) == key && mw->seq == w->seq && mw->op == w->op) waiters.push_back(m);
      if (last < w->seq) {
        behind.push_back(m);
        if (!mw) idle_behind.push_back(m);
      } else if (const CollectiveRecord* e = entry_for(m, key, w->seq); e && e->op != w->op) {
        wrong.push_back(m);
      }
    }
    const std::string what = op_text(*w) + " #" + std::to_string(w->seq) + " of group \"" + name + "\"";
    if (!behind.empty()) {
      CollectiveDiagnosis d;
      d.culprits = idle_behind.empty() ? behind : idle_behind;
      const int first = d.culprits.front();
      const int64_t its_last = last_collective(first, key);
      d.cause = rank_list(d.culprits) + (d.culprits.size() == 1 ? " has" : " have") + " not issued " + what + " (" +
                (d.culprits.size() == 1 ? "its" : "rank " + std::to_string(first) + "'s") + " last there: " +
                (its_last > 0 ? "#" + std::to_string(its_last) : std::string("none recorded")) + ", at step " +
                std::to_string(step_of(first)) + "), which " + rank_list(waiters) + (waiters.size() == 1 ? " waits" : " wait") + " in";
      return d;
    }
    if (!wrong.empty() && !mismatch) {
      const CollectiveRecord* e = entry_for(wrong.front(), key, w->seq);
      mismatch = CollectiveDiagnosis{wrong, rank_list(wrong) + " issued " + op_text(*e) + " as #" + std::to_string(w->seq) + " of group \"" +
                                                name + "\" where " + rank_list(waiters) + " issued " + op_text(*w) +
                                                " (the ranks run different programs)"};
    }
    if (!all_issued) all_issued = CollectiveDiagnosis{{}, "every rank of group \"" + name + "\" issued " + op_text(*w) + " #" + std::to_string(w->seq) + " and it never completed"};
  }
  if (mismatch) return *mismatch;
  if (all_issued) return *all_issued;
  return {};
}

std::string flight_record_json(const std::vector<ProgressFile>& files, const std::vector<bool>& present, int last) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t r = 0; r < files.size(); ++r) {
    if (!present[r]) {
      out.push_back({{"rank", r}, {"present", false}});
      continue;
    }
    const ProgressFile& file = files[r];
    const RankFlight flight = decode(file);
    nlohmann::ordered_json rank = {{"rank", r},
                                   {"pid", file.progress.pid},
                                   {"step", file.progress.step},
                                   {"phase", step_phase_name(static_cast<StepPhase>(file.progress.phase))},
                                   {"collectives_issued", file.progress.collectives}};
    if (file.progress.micro >= 0) {
      rank["micro_batch"] = file.progress.micro;
      rank["in"] = file.progress.micro_backward ? "backward" : "forward";
    }
    const size_t from = flight.entries.size() > static_cast<size_t>(last) ? flight.entries.size() - static_cast<size_t>(last) : 0;
    nlohmann::ordered_json ops = nlohmann::ordered_json::array();
    for (size_t i = from; i < flight.entries.size(); ++i) {
      const CollectiveRecord& e = flight.entries[i];
      nlohmann::ordered_json op = {{"group", group_name(file, e.group)}, {"op", op_text(e)}, {"seq", e.seq},
                                   {"step", e.step},                     {"bytes", e.bytes}, {"issued_ns", e.issued_ns}};
      if (e.peer >= 0) op["peer"] = e.peer;
      if (e.done_ns) op["done_ns"] = e.done_ns;
      else op["pending"] = true;
      ops.push_back(std::move(op));
    }
    rank["last_operations"] = std::move(ops);
    out.push_back(std::move(rank));
  }
  return out.dump(1);
}

}  // namespace strata
