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
// Under expert parallel of size E (data coordinate c = expert group x E + expert coordinate) one of
// S and E divides the other:
//   E | S: each shard group holds whole expert groups. A unit's split experts shard over the S/E
//          ranks of the shard group that hold the same experts, and replicate across the same
//          replica groups as the dense units: the ranks r +- S, ... hold the same experts, since E
//          divides S. Their pieces are disjoint within a shard group of S data ranks and equal
//          across the groups, as the dense pieces are (Placement::data_shard_size = S for both).
//   S | E: each expert group spans E/S shard groups, and no two ranks of a shard group hold the
//          same experts (expert parallel across nodes, HSDP within one). Each rank keeps its
//          experts whole (an expert shard group of one) and averages their gradients over the D/E
//          ranks holding the same experts (its expert-data group), as DeepSpeed's expert data
//          parallel does. Their pieces are disjoint within an expert group of E data ranks and
//          equal across the groups (data_shard_size = E).
// Neither dividing the other (S = 4, E = 6) is refused at plan time: a shard group would hold
// parts of two expert groups.
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

// How many ranks of a shard group hold the same experts: S/E when E | S, else 1.
int64_t expert_shard_size(int64_t shard_size, int64_t data, int64_t experts);

// Whether split experts are kept whole and averaged over their expert-data group (the D/E data
// ranks holding them) rather than sharded within the shard group: when E does not divide S, that
// is when S | E (no two ranks of a shard group hold the same experts) and when neither divides
// the other (a shard group holds some experts twice and others once: pieces of unequal groups).
bool experts_whole(int64_t shard_size, int64_t data, int64_t experts);

// The ranks of `expert_data_rank`'s expert shard group, numbered within its expert-data group (the
// D/E data ranks holding its experts, in data order).
std::vector<int> expert_shard_group(int64_t shard_size, int64_t data, int64_t experts, int64_t expert_data_rank);

// The contiguous data ranks within which split-expert pieces are disjoint (and equal across such
// groups): S when E | S, else E (experts whole: every E consecutive data ranks hold each expert once).
int64_t expert_pieces_group(int64_t shard_size, int64_t data, int64_t experts);

// "shard groups (data ranks) {0,1} {2,3}; replica groups {0,2} {1,3}" for `strata plan`.
std::string describe_groups(int64_t shard_size, int64_t data);

}  // namespace strata::fsdp
