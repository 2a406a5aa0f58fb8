// Packed training data: several documents in one window, separated by an end-of-document token.
// Attention must not cross a boundary, and position ids may restart at each document.
#pragma once

#include <cstdint>

#include "strata/config.h"
#include "strata/nn.h"

namespace strata {

struct PackedDocuments {
  int64_t document_end = -1;  // token id ending each document; -1: one document per window
  bool reset_positions = false;
  // The sequence layout of inputs [B, T]: every token's document id (an end token belongs to the
  // document it ends) and, with reset_positions, positions counted from each document's start.
  nn::SequenceLayout layout(const at::Tensor& inputs) const;
};

// [data] document_end and reset_positions where the dataset declares them (the bundled ones do);
// reset_positions without document_end is a UserError.
PackedDocuments packed_documents(const Config& data);

}  // namespace strata
