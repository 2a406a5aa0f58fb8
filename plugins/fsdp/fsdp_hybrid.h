// Hybrid sharding (HSDP, PyTorch's HYBRID_SHARD; Megatron-FSDP's outer data-parallel groups):
// `shard_size = S` splits the D data ranks into D/S shard groups of S contiguous data ranks
// (group g = data ranks [g S, (g+1) S), one node when data is the outermost dimension). Within a
// group the model states are fully sharded as plain fsdp shards them over all D: parameters are
// all-gathered and gradients reduce-scattered over the S ranks, so every rank holds 1/S of
// parameters, gradients and optimizer states (16 Psi / S bytes with fp32 AdamW). Across groups
// they are replicated: data rank r holds the same chunk as r +- S, r +- 2S, ... (its replica
// group of D/S ranks), and after the reduce-scatter each chunk of gradients is averaged over the
// replica group (an all-reduce of 1/S of the gradients). The all-gathers, the traffic of every
// forward and backward, stay inside a node; only the gradient average crosses nodes.
// Per step a rank sends (S-1)/S of the parameters per gather, (S-1)/S of the gradients in the
// reduce-scatter and 2 (D/S-1)/(D/S) x 1/S of them in the replica all-reduce (ring algorithms).
// S = D (the default, shard_size = 0) is plain fsdp; S = 1 is ddp with sharding nowhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::fsdp {

// The shard group size for `data` data ranks: `shard_size`, or all of them for 0.
int64_t effective_shard_size(int64_t shard_size, int64_t data);

// The data ranks (ascending) of the shard group and of the replica group holding `data_rank`.
std::vector<int> shard_group(int64_t shard_size, int64_t data, int64_t data_rank);
std::vector<int> replica_group(int64_t shard_size, int64_t data, int64_t data_rank);

// "shard groups (data ranks) {0,1} {2,3}; replica groups {0,2} {1,3}" for `strata plan`.
std::string describe_groups(int64_t shard_size, int64_t data);

}  // namespace strata::fsdp
