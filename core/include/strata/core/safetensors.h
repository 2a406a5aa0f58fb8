// The safetensors format, implemented here: 8-byte little-endian header length, a JSON header
// (dtype, shape, data_offsets per tensor, optional __metadata__), then the raw data.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "strata/errors.h"
#include "strata/optimizer.h"

namespace strata {

using Metadata = std::map<std::string, std::string>;

// What write_safetensors throws when the file system refuses the file (a full disk, no
// permission): the file and the system's reason, apart, so that a caller writing one file per rank
// can say the same line on every rank. The partial file is removed first.
class STRATA_API FileWriteError : public UserError {
 public:
  FileWriteError(const std::filesystem::path& path, const std::string& reason);
  ~FileWriteError() override;
  std::filesystem::path path;
  std::string reason;
};

// Sees every byte write_safetensors writes, in file order, in pieces of at most 64 MiB: a caller
// hashes the file as it is written (not reading it back) and counts a long write as progress.
using WrittenBytes = std::function<void(const void* data, size_t size)>;

// Called with a tensor's name just before write_safetensors reads its values and just after it
// has written them (the header needs shapes and dtypes only): an export fills each parameter
// from the checkpoint as it comes up and gives its memory back once written (export.cpp).
struct TensorWriteHooks {
  std::function<void(const std::string& name)> before, after;
};

// Writes to a temporary name, fsyncs, then renames over `path`. Tensors are written contiguous
// and little-endian, one at a time (a view, a device tensor or a cast costs that tensor's copy
// alone); names must be unique and tensors must not overlap. With `floating_as`, floating-point
// tensors are stored in that dtype (an export's bf16 weights from fp32 parameters).
STRATA_API void write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                                  const Metadata& metadata = {}, const WrittenBytes& written = {},
                                  at::ScalarType floating_as = at::ScalarType::Undefined, const TensorWriteHooks& hooks = {});

// The dtype write_safetensors stores `tensor` in: `floating_as` for a floating-point tensor when
// given, else its own.
STRATA_API at::ScalarType safetensors_stored_dtype(const at::Tensor& tensor,
                                                   at::ScalarType floating_as = at::ScalarType::Undefined);

// Reads and validates everything the format promises; any violation is a UserError naming the
// file and the problem. Tensors come back on the CPU in file order.
STRATA_API NamedTensors read_safetensors(const std::filesystem::path& path, Metadata* metadata = nullptr);
// The same for a file already in memory (`label` names it in messages).
STRATA_API NamedTensors parse_safetensors(const std::string& bytes, const std::string& label, Metadata* metadata = nullptr);
STRATA_API NamedTensors parse_safetensors(std::string_view bytes, const std::string& label, Metadata* metadata = nullptr);

// The bytes of a file before its data: the 8-byte length and the JSON header (padded to a
// multiple of 8) for `tensors` laid out contiguously in order. The data follows as each tensor's
// bytes, contiguous, in the same order: what a writer into memory copies after the prefix.
STRATA_API std::string safetensors_prefix(const NamedTensors& tensors, const Metadata& metadata = {},
                                          at::ScalarType floating_as = at::ScalarType::Undefined);

}  // namespace strata
