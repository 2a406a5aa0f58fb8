// How context parallel splits each window's tokens over the context ranks. The window is cut
// into 2c equal chunks and context rank i holds chunks i and 2c-1-i ("zigzag"): under causal
// attention an early chunk has little to attend to and a late one much, so every rank gets one
// of each and the same work. `contiguous` (chunk i of c) exists to measure the difference.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace strata::context_parallel {

struct SequenceSplit {
  int64_t window = 0;  // tokens per window (seq_len)
  int ranks = 1;       // c
  bool zigzag = true;
  // Tokens per chunk: window / 2c under zigzag, window / c otherwise.
  int64_t chunk_length() const;
  // The chunks context rank `rank` holds, in the order its tokens are laid out.
  std::vector<int64_t> chunks_of(int rank) const;
  // Window positions of `chunks`, concatenated: [chunks.size() * chunk_length()] int64.
  at::Tensor token_index(const std::vector<int64_t>& chunks, const at::Device& device) const;
};

}  // namespace strata::context_parallel
