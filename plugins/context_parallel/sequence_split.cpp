#include "sequence_split.h"

#include <ATen/ATen.h>

namespace strata::context_parallel {

int64_t SequenceSplit::chunk_length() const { return window / (zigzag ? 2 * ranks : ranks); }

std::vector<int64_t> SequenceSplit::chunks_of(int rank) const {
  if (!zigzag) return {rank};
  return {rank, 2 * static_cast<int64_t>(ranks) - 1 - rank};
}

at::Tensor SequenceSplit::token_index(const std::vector<int64_t>& chunks, const at::Device& device) const {
  const int64_t length = chunk_length();
  std::vector<at::Tensor> parts;
  // Built on the device: a host-to-device copy would stall the host between kernels.
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  for (int64_t chunk : chunks) parts.push_back(at::arange(chunk * length, (chunk + 1) * length, options));
  return at::cat(parts);
}

}  // namespace strata::context_parallel
