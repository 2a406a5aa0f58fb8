#include "fsdp_hybrid.h"

namespace strata::fsdp {

int64_t effective_shard_size(int64_t shard_size, int64_t data) { return shard_size == 0 ? data : shard_size; }

std::vector<int> shard_group(int64_t shard_size, int64_t data, int64_t data_rank) {
  const int64_t s = effective_shard_size(shard_size, data), first = data_rank / s * s;
  std::vector<int> ranks;
  for (int64_t r = first; r < first + s; ++r) ranks.push_back(static_cast<int>(r));
  return ranks;
}

std::vector<int> replica_group(int64_t shard_size, int64_t data, int64_t data_rank) {
  const int64_t s = effective_shard_size(shard_size, data);
  std::vector<int> ranks;
  for (int64_t r = data_rank % s; r < data; r += s) ranks.push_back(static_cast<int>(r));
  return ranks;
}

int64_t expert_shard_size(int64_t shard_size, int64_t data, int64_t experts) {
  const int64_t s = effective_shard_size(shard_size, data);
  return s % experts == 0 ? s / experts : 1;
}

std::vector<int> expert_shard_group(int64_t shard_size, int64_t data, int64_t experts, int64_t expert_data_rank) {
  // The expert-data group's member i is data rank i E + (expert coordinate): a shard group of S
  // data ranks holds S/E consecutive members when E | S, and only this rank when S | E.
  return shard_group(expert_shard_size(shard_size, data, experts), data / experts, expert_data_rank);
}

bool experts_whole(int64_t shard_size, int64_t data, int64_t experts) {
  return effective_shard_size(shard_size, data) % experts != 0;
}

int64_t expert_pieces_group(int64_t shard_size, int64_t data, int64_t experts) {
  const int64_t s = effective_shard_size(shard_size, data);
  return experts_whole(shard_size, data, experts) ? experts : s;
}

std::string describe_groups(int64_t shard_size, int64_t data) {
  const int64_t s = effective_shard_size(shard_size, data);
  auto set = [](const std::vector<int>& ranks) {
    std::string out = "{";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
    return out + "}";
  };
  std::string shards, replicas;
  for (int64_t g = 0; g < data / s; ++g) shards += " " + set(shard_group(s, data, g * s));
  for (int64_t p = 0; p < s; ++p) replicas += " " + set(replica_group(s, data, p));
  return "shard groups (data ranks)" + shards + "; replica groups" + replicas;
}

}  // namespace strata::fsdp
