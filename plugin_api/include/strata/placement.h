// Placements: how a tensor a rank holds relates to the whole (logical) tensor and to the mesh.
// One description serves parameters (a tensor-parallel layer's shard), the pieces a sharding pass
// keeps of them, optimizer state, gradients (clipping) and checkpoints (which record it, so state
// saved under one layout loads under any other).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/claims.h"
#include "strata/export.h"

namespace strata {

// Sharding nests in two levels, as tensor parallel then fsdp do:
//  1. a rectangular block of the whole tensor (`block_start`/`block_size` per dimension; empty =
//     the whole tensor). With `sections` > 1, dimension 0 of the whole tensor is that many equal
//     sections side by side and the block takes rows [block_start[0], block_start[0] +
//     block_size[0] / sections) of each (a fused layer such as GPT-2's c_attn, split per head);
//  2. elements [offset, offset + numel) of the block's row-major flattening (a flat shard).
// The mesh side: over the dimensions in `sharded_over` ranks hold disjoint pieces; over those in
// `partial_over` they hold addends whose sum is the value (a gradient before its sync); over
// every other dimension they hold equal copies (replicas). A default Placement is a whole,
// replicated tensor. With `data_shard_size` S > 0 (HSDP), the pieces sharded over Data are disjoint
// only within groups of S contiguous data ranks (data rank r is in group r / S) and equal across
// the groups.
struct Placement {
  std::vector<int64_t> shape;  // of the whole tensor (a LocalGradient's may be left empty)
  std::vector<int64_t> block_start, block_size;
  int64_t sections = 1;
  int64_t offset = 0;
  std::vector<Dim> sharded_over;
  std::vector<Dim> partial_over;
  int64_t data_shard_size = 0;  // 0: sharded over every data rank (with Data in sharded_over)

  bool has_block() const { return !block_size.empty(); }
  bool is_sharded_over(Dim dim) const;
};

// By tensor name; a name without an entry is whole and replicated.
using Placements = std::map<std::string, Placement>;

// `flat` (elements [offset, +numel) of a tensor) taken from a tensor placed as `outer`: the
// nested placement, sharded over both placements' dimensions.
STRATA_API Placement nest(const Placement& outer, int64_t offset, const std::vector<Dim>& sharded_over);

// A problem with `placement` for a local tensor of `numel` elements (a block outside the whole
// tensor, sections that do not divide, elements past the end), or empty when it is consistent.
STRATA_API std::string placement_problem(const Placement& placement, int64_t numel);

// Where the `numel` elements of a piece placed as `placement` sit in the whole tensor: their
// positions in its row-major flattening, ascending (a block's row-major order is the whole
// tensor's order restricted to it; sections along dimension 0 come in order), as int64.
// Checkpoint loading matches pieces of different layouts element by element through these.
STRATA_API at::Tensor whole_positions(const Placement& placement, int64_t numel);

// The piece of `whole` (a tensor of `placement.shape`) that `placement` names, shaped
// `piece_shape`: what a rank holding that piece holds (a split parameter from whole weights).
// An inconsistent placement or shape is an std::invalid_argument.
STRATA_API at::Tensor piece_of(const at::Tensor& whole, const Placement& placement, at::IntArrayRef piece_shape);

}  // namespace strata
