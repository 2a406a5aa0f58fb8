// SHA-256 of checkpoint files (core/src/checkpoint/sha256.h) against FIPS 180-4's test vectors,
// fed whole and in uneven pieces. CTest runs these once as the CPU is and once per forced
// fallback of OpenSSL's dispatch (OPENSSL_ia32cap: no SHA extensions; no SHA, AVX2, AVX or SSSE3),
// so every code path a user's CPU may take is checked against the same digests.
#include "checkpoint/sha256.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "strata/errors.h"

namespace strata {
namespace {

std::string digest_of(const std::string& text, size_t piece) {
  Sha256 hash;
  for (size_t at = 0; at < text.size(); at += piece) hash.update(text.data() + at, std::min(piece, text.size() - at));
  return hash.hex_digest();
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(digest_of("", 1), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digest_of("abc", 1), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 64),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, MillionAsInAnyPieces) {
  const std::string million(1000000, 'a');
  for (size_t piece : {size_t{1} << 20, size_t{4093}, size_t{64}, size_t{63}})
    EXPECT_EQ(digest_of(million, piece), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") << piece;
}

TEST(Sha256, FileMatchesBytes) {
  const auto path = std::filesystem::temp_directory_path() / ("strata_sha256_" + std::to_string(::getpid()));
  std::string bytes(9 << 20, '\0');  // over two of sha256_file's chunks
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 24);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_EQ(sha256_file(path), digest_of(bytes, bytes.size()));
  std::filesystem::remove(path);
  EXPECT_THROW(sha256_file(path), UserError);
}

}  // namespace
}  // namespace strata
