// Splitting the model's block sequence into the pipeline's virtual stages: uniform (by blocks),
// balanced (by measured block times under a memory cap) or a manual layout of block names.
#pragma once

#include <string>
#include <vector>

#include "strata/nn.h"

namespace strata::pipeline {

// Blocks [first, last) of the model, in order, for each virtual stage.
struct StageBlocks {
  size_t first = 0, last = 0;
};
using Partition = std::vector<StageBlocks>;

// What a block costs: its parameters, its measured forward + backward seconds on one
// micro-batch, and an estimate of the activation bytes it keeps for backward per micro-batch.
struct BlockCost {
  std::string name, type;
  int64_t params = 0;
  double seconds = 0;
  double activation_bytes = 0;
};

// Stages as equal as block counts allow; the later stages take the extra blocks (the first
// stages hold the most micro-batches in flight under 1F1B).
Partition uniform_partition(size_t blocks, int stages);

// Contiguous stages minimising the slowest stage's time, each stage's memory (model states at
// 16 bytes per parameter, fp32 AdamW, plus activations of in_flight[s] micro-batches) at most
// `memory_cap_bytes` when it is > 0. Empty when no split fits under the cap.
Partition balanced_partition(const std::vector<BlockCost>& costs, const std::vector<int>& in_flight, double memory_cap_bytes);

// A manual layout: per stage, block names separated by spaces, or "first..last" for a run.
// `problem` names what is wrong: an unknown name, a block dropped or repeated, stages out of
// model order, or a count that is not the number of virtual stages.
Partition layout_partition(const nn::Model& model, const std::vector<std::string>& layout, int stages, std::string& problem);

// Times each block's forward and backward on random tokens [micro_batch, seq_len] (the best of
// `repeats`), leaving parameters, gradients and the random generators as they were.
std::vector<BlockCost> measure_blocks(nn::Model& model, int64_t micro_batch, int64_t heads, int repeats);

// Model-state and activation bytes of a stage of `costs` with `in_flight` micro-batches.
double stage_memory_bytes(const std::vector<BlockCost>& costs, StageBlocks stage, int in_flight);

}  // namespace strata::pipeline
