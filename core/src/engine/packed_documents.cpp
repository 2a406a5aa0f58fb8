#include "packed_documents.h"

#include <ATen/ATen.h>

#include "strata/errors.h"

namespace strata {

nn::SequenceLayout PackedDocuments::layout(const at::Tensor& inputs) const {
  nn::SequenceLayout out;
  out.window = inputs.size(1);
  if (document_end < 0) return out;
  const at::Tensor ends = inputs.eq(document_end).to(at::kLong);
  out.documents = ends.cumsum(1) - ends;
  if (reset_positions) {
    // A document starts at 0 and after each end token; a token's position is its distance from
    // the latest start at or before it.
    const at::Tensor index = at::arange(out.window, inputs.options().dtype(at::kLong)).expand_as(inputs);
    at::Tensor starts = at::zeros_like(ends);
    starts.narrow(1, 1, out.window - 1).copy_(ends.narrow(1, 0, out.window - 1));
    starts.select(1, 0).fill_(1);
    out.positions = index - std::get<0>(at::cummax(index * starts, 1));
  }
  return out;
}

PackedDocuments packed_documents(const Config& data) {
  PackedDocuments out;
  if (data.has("document_end")) out.document_end = data.get_int("document_end");
  if (data.has("reset_positions")) out.reset_positions = data.get_bool("reset_positions");
  if (out.reset_positions && out.document_end < 0)
    throw UserError("[data] reset_positions = true needs document_end (the token that ends each document)");
  return out;
}

}  // namespace strata
