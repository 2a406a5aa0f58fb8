// SHA-256 (FIPS 180-4), for checkpoint checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace strata {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::string hex_digest();  // finishes the hash

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;
};

// Hex digest of a whole file; throws UserError when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace strata
