// SHA-256 (FIPS 180-4), for checkpoint checksums; OpenSSL's libcrypto computes it.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of every includer

namespace strata {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string hex_digest();  // finishes the hash

 private:
  evp_md_ctx_st* context_;
};

// Hex digest of a whole file; throws UserError when it cannot be read. `each_chunk` runs after
// every 4 MiB hashed (a long hash is progress to the supervisor's hang watch).
std::string sha256_file(const std::filesystem::path& path, const std::function<void()>& each_chunk = {});

}  // namespace strata
