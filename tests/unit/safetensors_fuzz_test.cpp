// Hostile safetensors headers never crash the reader (issue 21). Unlike the byte mutations in
// safetensors_test.cpp, which mostly break the JSON, this builds headers from the parts a broken
// or hostile writer controls, so the checks behind the JSON syntax are reached: random nesting at
// any position, dimensions and offsets near 2^31/2^32/2^62/2^63/2^64, values of the wrong type,
// repeated names, shapes that hold no elements but whose other dimensions are huge, offsets that
// overlap or leave holes, truncated or padded data, wrong header lengths. Each case must parse
// or throw UserError: no other exception, no signal. Seeded and bounded; a failing case is
// printed with its header.
#include <cstdint>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/errors.h"
#include "strata/core/safetensors.h"

namespace strata {
namespace {

std::string with_length(const std::string& header, uint64_t length, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(length >> (8 * i));
  return out + header + data;
}

class HeaderGenerator {
 public:
  explicit HeaderGenerator(uint64_t seed) : rng_(seed) {}

  struct Case {
    std::string header, data;
    uint64_t length;  // as written in the first 8 bytes
  };

  Case next() {
    Case out;
    offset_ = 0;
    std::string text = "{";
    const int entries = static_cast<int>(pick(6));
    for (int i = 0; i < entries; ++i) {
      if (i) text += ",";
      text += "\"" + name() + "\":" + (chance(12) ? junk() : chance(10) ? metadata() : entry());
    }
    text += "}";
    if (chance(20)) text = nest(text);  // the whole header inside brackets
    if (chance(5)) text.append(pick(8), ' ');
    out.header = text;
    // The data the offsets describe, or a little less or more.
    uint64_t data_size = offset_ > 4096 ? pick(64) : offset_;
    if (chance(10)) data_size = data_size > 0 ? data_size - 1 - pick(data_size) : 0;
    if (chance(10)) data_size += 1 + pick(8);
    out.data.assign(data_size, '\x3f');  // every byte pattern is a finite float
    out.length = text.size();
    if (chance(20)) {
      const uint64_t lengths[] = {0, 1, text.size() - 1, text.size() + 1, 1ull << 32, UINT64_MAX};
      out.length = lengths[pick(6)];
    }
    return out;
  }

 private:
  std::mt19937_64 rng_;
  uint64_t offset_ = 0;  // where the next well-formed tensor's data begins

  uint64_t pick(uint64_t n) { return n ? rng_() % n : 0; }
  bool chance(uint64_t one_in) { return pick(one_in) == 0; }

  // Few names, so that they repeat; some look like JSON syntax.
  std::string name() {
    const std::vector<std::string> names = {"a", "b", "c", "__metadata__", "", "[[{", "w\\\"q", "x.weight"};
    return names[pick(names.size())];
  }

  // Brackets or objects `levels` deep around a value: a few, past the reader's bound, or a
  // hostile amount (100,000 levels inside a shape crashed the reader before issue 21).
  std::string nest(const std::string& inner) {
    const uint64_t depths[] = {1, 2, 5, 9, 100, 20000, 100000};
    const uint64_t levels = depths[pick(7)];
    std::string out;
    if (chance(2)) {
      out.reserve(inner.size() + 2 * levels);
      out.append(levels, '[');
      out += inner;
      out.append(levels, ']');
    } else {
      for (uint64_t i = 0; i < levels; ++i) out += "{\"k\":";
      out += inner;
      out.append(levels, '}');
    }
    return out;
  }

  std::string number() {
    const std::vector<std::string> numbers = {"0", "1", "2", "3", "4", "2147483648", "4294967296", "4611686018427387904",
                                              "9223372036854775807", "9223372036854775808", "18446744073709551615",
                                              "18446744073709551616", "-1", "1.5", "1e400", "-0"};
    return numbers[pick(numbers.size())];
  }

  // A value of the wrong type, sometimes nested.
  std::string junk() {
    const std::vector<std::string> values = {"null", "true", "\"F32\"", "[]", "{}", "[1,2]", "{\"dtype\":\"F32\"}"};
    std::string v = chance(2) ? number() : values[pick(values.size())];
    return chance(4) ? nest(v) : v;
  }

  std::string metadata() {
    switch (pick(4)) {
      case 0: return "{\"format\":\"pt\"}";
      case 1: return "{\"format\":" + junk() + "}";
      case 2: return "{\"slices\":\"" + std::string(pick(50), '[') + "\"}";
      default: return junk();
    }
  }

  std::string dtype(uint64_t* element_size) {
    const std::vector<std::pair<std::string, uint64_t>> dtypes = {{"F32", 4}, {"BF16", 2}, {"F64", 8}, {"U8", 1}, {"BOOL", 1},
                                                                  {"I64", 8}, {"C64", 8},  {"F8_E4M3", 1}};
    if (chance(8)) {
      *element_size = 1;
      return chance(2) ? "\"f32\"" : junk();
    }
    const auto& [name, size] = dtypes[pick(dtypes.size())];
    *element_size = size;
    return "\"" + name + "\"";
  }

  // A shape, and its element count when it is a list of plain integers that fit (else nullopt).
  std::string shape(std::optional<uint64_t>* numel) {
    if (chance(15)) {
      *numel = std::nullopt;
      return junk();
    }
    std::string text = "[";
    uint64_t count = 1;
    bool counted = true;
    const uint64_t rank = pick(5);
    for (uint64_t d = 0; d < rank; ++d) {
      if (d) text += ",";
      std::string dim;
      if (chance(3)) {
        dim = std::to_string(pick(4));  // small, often 0
      } else if (chance(12)) {
        dim = junk();
      } else {
        dim = number();
      }
      text += dim;
      uint64_t value = 0;
      const bool plain = !dim.empty() && dim.find_first_not_of("0123456789") == std::string::npos && dim.size() < 20;
      if (!plain) {
        counted = false;
        continue;
      }
      value = std::stoull(dim);
      if (__builtin_mul_overflow(count, value, &count)) counted = false;
    }
    text += "]";
    *numel = counted ? std::optional<uint64_t>(count) : std::nullopt;
    return chance(25) ? nest(text) : text;
  }

  // Offsets that tile the data when the size is known, or broken ones.
  std::string offsets(std::optional<uint64_t> bytes) {
    if (bytes && !chance(6)) {
      const uint64_t begin = offset_;
      uint64_t end = 0;
      if (__builtin_add_overflow(begin, *bytes, &end)) end = UINT64_MAX;
      offset_ = end;
      return "[" + std::to_string(begin) + "," + std::to_string(end) + "]";
    }
    switch (pick(6)) {
      case 0: return "[" + std::to_string(offset_ + 8) + "," + std::to_string(offset_) + "]";  // ends before it begins
      case 1: return "[0," + number() + "]";
      case 2: return "[" + number() + "," + number() + "]";
      case 3: return "[0,4,8]";
      case 4: return "[0]";
      default: return junk();
    }
  }

  std::string entry() {
    uint64_t element_size = 1;
    std::optional<uint64_t> numel;
    const std::string d = dtype(&element_size);
    const std::string s = shape(&numel);
    std::optional<uint64_t> bytes;
    uint64_t product = 0;
    if (numel && !__builtin_mul_overflow(*numel, element_size, &product)) bytes = product;
    const std::string o = offsets(bytes);
    std::vector<std::string> fields = {"\"dtype\":" + d, "\"shape\":" + s, "\"data_offsets\":" + o};
    if (chance(10)) fields.erase(fields.begin() + static_cast<long>(pick(3)));  // a field missing
    if (chance(10)) fields.push_back(fields[pick(fields.size())]);             // a field twice
    if (chance(10)) fields.push_back("\"extra\":" + junk());
    if (chance(3)) std::swap(fields[0], fields[pick(fields.size())]);
    std::string text = "{";
    for (size_t i = 0; i < fields.size(); ++i) text += (i ? "," : "") + fields[i];
    return text + "}";
  }
};

TEST(SafetensorsFuzz, GeneratedHeadersParseOrFailCleanly) {
  HeaderGenerator generate(21);
  int parsed = 0, refused = 0, nonempty = 0;
  for (int c = 0; c < 2000; ++c) {
    const HeaderGenerator::Case k = generate.next();
    const std::string bytes = with_length(k.header, k.length, k.data);
    try {
      const NamedTensors tensors = parse_safetensors(bytes, "fuzz.safetensors");
      ++parsed;
      // What parses is consistent: the tensors account for exactly the data that follows.
      uint64_t total = 0;
      for (const auto& [name, tensor] : tensors) total += static_cast<uint64_t>(tensor.nbytes());
      EXPECT_EQ(total, k.data.size()) << "case " << c << ": " << k.header.substr(0, 400);
      nonempty += total > 0;
    } catch (const UserError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << c << ": " << typeid(e).name() << ": " << std::string(e.what()).substr(0, 300)
                    << "\n--- header ---\n"
                    << k.header.substr(0, 400);
    }
  }
  // Both outcomes must be common, or the generator proves little.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(nonempty, 20);
  EXPECT_GT(refused, 1000);
  std::cout << parsed << " parsed (" << nonempty << " with data), " << refused << " refused\n";
}

}  // namespace
}  // namespace strata
