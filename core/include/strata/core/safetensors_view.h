// Reading safetensors files without copying them: a file mapped into memory, and its tensors as
// views of the mapping. A rank that resumes from a checkpoint copies only the elements its own
// pieces need (core/src/checkpoint/checkpoint.cpp); the rest of each file is never read into its memory,
// where reading a file whole held it (and a copy) at once.
#pragma once

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "strata/export.h"
#include "strata/core/safetensors.h"

namespace strata {

// A file mapped read-only (shared with the page cache: pages count as this process's resident
// memory only once touched). Errors are UserErrors naming the file.
class STRATA_API MappedFile {
 public:
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  // Lets go of the pages wholly inside [begin, begin + bytes) of the mapping (read again from the
  // page cache if touched again), so reading a file tensor by tensor holds about one at a time.
  void release_pages(const void* begin, size_t bytes) const;

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// parse_safetensors's checks, but each tensor is a read-only view of `bytes` (copied only where
// its bytes are misaligned for its dtype) that keeps `owner` alive. Writing into one is an error
// the MMU reports: the views are for reading.
STRATA_API NamedTensors view_safetensors(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& label,
                              Metadata* metadata = nullptr);

}  // namespace strata
