// SHA-256 through OpenSSL's libcrypto. Checkpoints hash every byte they write and verify every
// byte they load, so the hash is on the critical path of save, load and export: OpenSSL picks
// the fastest code this CPU runs at start-up (SHA-NI, then AVX2/AVX/SSSE3, then plain C; about
// 1.5 GB/s with SHA-NI against 0.25 GB/s for the portable C this replaced), and
// OPENSSL_ia32cap forces its fallbacks (tests/unit/sha256_test.cpp).
#include "sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <stdexcept>
#include <vector>

#include "strata/errors.h"

namespace strata {

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
  if (context_ == nullptr || EVP_DigestInit_ex(context_, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL could not start a SHA-256 digest");
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_); }

void Sha256::update(const void* data, size_t size) {
  if (size > 0 && EVP_DigestUpdate(context_, data, size) != 1) throw std::runtime_error("OpenSSL's SHA-256 update failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(context_, digest, &length) != 1) throw std::runtime_error("OpenSSL's SHA-256 final failed");
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    out += digits[digest[i] >> 4];
    out += digits[digest[i] & 0xf];
  }
  return out;
}

std::string sha256_file(const std::filesystem::path& path, const std::function<void()>& each_chunk) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read " + path.string());
  Sha256 hash;
  std::vector<char> chunk(4 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    hash.update(chunk.data(), static_cast<size_t>(in.gcount()));
    if (each_chunk) each_chunk();
  }
  if (in.bad()) throw UserError("cannot read " + path.string());
  return hash.hex_digest();
}

}  // namespace strata
