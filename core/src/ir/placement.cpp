#include "strata/placement.h"

#include "strata/optimizer.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

namespace strata {

bool Placement::is_sharded_over(Dim dim) const {
  return std::find(sharded_over.begin(), sharded_over.end(), dim) != sharded_over.end();
}

Placement nest(const Placement& outer, int64_t offset, const std::vector<Dim>& sharded_over) {
  Placement out = outer;
  out.offset = outer.offset + offset;
  for (Dim d : sharded_over)
    if (!out.is_sharded_over(d)) out.sharded_over.push_back(d);
  return out;
}

std::string placement_problem(const Placement& p, int64_t numel) {
  const size_t rank = p.shape.size();
  if (std::any_of(p.shape.begin(), p.shape.end(), [](int64_t s) { return s < 0; })) return "a negative whole shape";
  if (p.has_block() && (p.block_start.size() != rank || p.block_size.size() != rank))
    return "a block with another number of dimensions than its whole tensor";
  if (p.sections < 1) return "fewer than one section";
  if (p.sections > 1 && (rank == 0 || !p.has_block() || p.shape[0] % p.sections != 0 || p.block_size[0] % p.sections != 0))
    return "sections that do not divide dimension 0 of its block and whole tensor";
  int64_t whole = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (!p.has_block()) {
      if (__builtin_mul_overflow(whole, p.shape[d], &whole)) return "a whole shape too large to count";
      continue;
    }
    const int64_t extent = d == 0 ? p.shape[0] / p.sections : p.shape[d];
    const int64_t size = d == 0 ? p.block_size[0] / p.sections : p.block_size[d];
    if (p.block_start[d] < 0 || size < 0 || p.block_start[d] + size > extent) return "a block outside its whole tensor";
    if (__builtin_mul_overflow(whole, p.block_size[d], &whole)) return "a block too large to count";
  }
  if (p.offset < 0 || numel < 0 || p.offset > whole - numel) return "elements past the end of its whole tensor";
  return {};
}

at::Tensor whole_positions(const Placement& placement, int64_t numel) {
  if (!placement.has_block()) return at::arange(placement.offset, placement.offset + numel, at::kLong);
  const std::vector<int64_t>& shape = placement.shape;
  at::Tensor index = at::zeros({}, at::kLong);
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    at::Tensor along = at::arange(placement.block_size[d], at::kLong) + placement.block_start[d];
    if (d == 0 && placement.sections > 1) {
      // Section s holds rows [s * shape[0] / sections + block_start, + block_size / sections).
      const int64_t per_section = placement.block_size[0] / placement.sections;
      along = (at::arange(per_section, at::kLong) + placement.block_start[0]).repeat({placement.sections}) +
              at::arange(placement.sections, at::kLong).repeat_interleave(per_section) * (shape[0] / placement.sections);
    }
    std::vector<int64_t> view(shape.size(), 1);
    view[d] = placement.block_size[d];
    index = index + (along * stride).view(view);
    stride *= shape[d];
  }
  return index.reshape(-1).narrow(0, placement.offset, numel);
}

at::Tensor piece_of(const at::Tensor& whole, const Placement& placement, at::IntArrayRef piece_shape) {
  const int64_t numel = c10::multiply_integers(piece_shape);
  std::string problem = placement_problem(placement, numel);
  if (problem.empty() && whole.sizes() != at::IntArrayRef(placement.shape)) problem = "another whole shape than the tensor given";
  if (!problem.empty()) throw std::invalid_argument("piece_of: a placement with " + problem);
  return whole.reshape(-1).index({whole_positions(placement, numel)}).view(piece_shape);
}

Placements state_placements_by_parameter(const NamedTensors& state, const std::map<std::string, at::Tensor>& params,
                                          const Placements& placements) {
  Placements out;
  for (const auto& [name, tensor] : state) {
    // The longest "<parameter>." prefix names the parameter (parameter names contain dots).
    for (size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0; dot = name.rfind('.', dot - 1)) {
      const std::string parameter = name.substr(0, dot);
      const auto param = params.find(parameter);
      if (param == params.end()) continue;
      const auto placement = placements.find(parameter);
      if (placement != placements.end() && param->second.defined() && tensor.sizes() == param->second.sizes())
        out.emplace(name, placement->second);
      break;
    }
  }
  return out;
}

}  // namespace strata
