// safetensors: round trips, and refusal of every malformation the format forbids.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/safetensors.h"
#include "strata/errors.h"

namespace strata {
namespace {

std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

std::string parse_error(const std::string& bytes) {
  try {
    parse_safetensors(bytes, "t.safetensors");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripKeepsNamesOrderDtypesAndMetadata) {
  const auto path = std::filesystem::temp_directory_path() / "strata_roundtrip.safetensors";
  NamedTensors tensors{{"w", at::randn({3, 4})},
                       {"half", at::randn({5}).to(at::kBFloat16)},
                       {"ids", at::arange(6, at::kLong).view({2, 3})},
                       {"flag", at::ones({2}, at::kBool)},
                       {"scalar", at::tensor(3.5, at::kDouble)},
                       {"empty", at::empty({0, 4})},
                       {"f16", at::randn({2, 2}).to(at::kHalf)}};
  write_safetensors(path, tensors, {{"format", "pt"}});
  Metadata metadata;
  NamedTensors back = read_safetensors(path, &metadata);
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_EQ(back[i].second.scalar_type(), tensors[i].second.scalar_type());
    EXPECT_TRUE(at::equal(back[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(metadata.at("format"), "pt");
  // The header is padded to a multiple of 8 bytes, as writers do.
  std::ifstream in(path, std::ios::binary);
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  EXPECT_EQ(le[0] % 8, 0);
  std::filesystem::remove(path);
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  std::string data(8, '\0');
  float values[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), values, 8);
  NamedTensors t = parse_safetensors(file_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data), "x");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_FLOAT_EQ(t[0].second[1].item<float>(), -2.0f);
}

TEST(Safetensors, RefusesMalformedFiles) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_NE(parse_error("short").find("shorter than its 8-byte header length"), std::string::npos);
  std::string huge(8, '\0');
  huge[4] = 1;  // 2^32 bytes of header
  EXPECT_NE(parse_error(huge + "{}").find("over the 100000000-byte limit"), std::string::npos);
  EXPECT_NE(parse_error(file_bytes("{" + ok_entry + "}", std::string(4, '\0'))).find("truncated or padded"), std::string::npos);
  EXPECT_NE(parse_error(file_bytes("{" + ok_entry + "}", std::string(12, '\0'))).find("truncated or padded"), std::string::npos);
  EXPECT_NE(parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')))
                .find("need 12"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   std::string(12, '\0')))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, '\0')))
                .find("hole in the data before tensor 'a'"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes("{" + ok_entry + "," + ok_entry + "}", std::string(8, '\0'))).find("names a tensor twice"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')))
                .find("unknown dtype"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')))
                .find("negative or non-integer dimension"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes(R"({"__metadata__":{"k":1}})", "")).find("__metadata__ value of 'k' is not a string"),
            std::string::npos);
  EXPECT_NE(parse_error(file_bytes("[1,2]", "")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse_error(file_bytes("{\"a\":", "")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", "")).find("needs dtype, shape and data_offsets"),
            std::string::npos);
}

TEST(Safetensors, EmptyAndZeroDimensionalTensorsAreAllowed) {
  std::string data(4, '\0');
  NamedTensors t = parse_safetensors(
      file_bytes(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"s":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})", data),
      "x");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].second.numel(), 0);
  EXPECT_EQ(t[1].second.dim(), 0);
}

}  // namespace
}  // namespace strata
