#include "strata/core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "strata/core/safetensors_view.h"
#include "strata/errors.h"

namespace strata {

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;
constexpr int kMaxDepth = 8;

// SAX events of a JSON document, remembering the first key that repeats at the top level.
struct TopLevelKeys : nlohmann::json_sax<nlohmann::json> {
  int depth = 0;
  std::set<std::string> seen;
  std::optional<std::string> duplicate;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& name) override {
    if (depth == 1 && !seen.insert(name).second && !duplicate) duplicate = name;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

// The deepest nesting of objects and arrays in JSON text, outside strings.
int nesting_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<std::string, at::ScalarType>> names{
      {"BOOL", at::kBool},         {"U8", at::kByte},           {"I8", at::kChar},     {"I16", at::kShort},
      {"U16", at::kUInt16},        {"I32", at::kInt},           {"U32", at::kUInt32},  {"I64", at::kLong},
      {"U64", at::kUInt64},        {"F16", at::kHalf},          {"BF16", at::kBFloat16}, {"F32", at::kFloat},
      {"F64", at::kDouble},        {"C64", at::kComplexFloat},  {"F8_E5M2", at::kFloat8_e5m2},
      {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E8M0", at::kFloat8_e8m0fnu}};
  return names;
}

std::string dtype_name(at::ScalarType type) {
  for (const auto& [name, t] : dtype_names())
    if (t == type) return name;
  throw UserError(std::string("safetensors cannot store dtype ") + c10::toString(type));
}

// Two tensors whose bytes overlap (a tied weight listed twice) would be written twice and read
// back as two: refused. Views of one storage that do not overlap (the experts of a stacked
// tensor, each its own slice) are written as the separate tensors they are.
void refuse_overlaps(const NamedTensors& tensors) {
  struct Span {
    size_t begin, end;
    const std::string* name;
  };
  std::map<const void*, std::vector<Span>> by_storage;
  for (const auto& [name, tensor] : tensors) {
    if (tensor.numel() == 0) continue;
    int64_t last = 0;  // the furthest element from the first, in elements
    for (int64_t d = 0; d < tensor.dim(); ++d) last += (tensor.size(d) - 1) * std::abs(tensor.stride(d));
    const size_t item = tensor.element_size(), begin = static_cast<size_t>(tensor.storage_offset()) * item;
    by_storage[tensor.storage().data()].push_back({begin, begin + static_cast<size_t>(last + 1) * item, &name});
  }
  for (auto& [storage, spans] : by_storage) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].begin < spans[i - 1].end)
        throw std::logic_error("safetensors: tensor '" + *spans[i].name + "' aliases tensor '" + *spans[i - 1].name + "'");
  }
}

}  // namespace

std::string safetensors_prefix(const NamedTensors& tensors, const Metadata& metadata, at::ScalarType floating_as) {
  // The header is written entry by entry: an ordered JSON object finds keys by a linear scan, so
  // building one of n tensors costs n^2 (minutes at 80,000 tensors).
  std::string text = "{";
  if (!metadata.empty()) text += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!names.insert(name).second) throw std::logic_error("safetensors: tensor name '" + name + "' repeats");
    const at::ScalarType dtype = safetensors_stored_dtype(tensor, floating_as);
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * c10::elementSize(dtype);
    const nlohmann::ordered_json entry = {
        {"dtype", dtype_name(dtype)}, {"shape", tensor.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    text += (text.size() > 1 ? "," : "") + nlohmann::json(name).dump() + ":" + entry.dump();
    offset += bytes;
  }
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>(text.size() >> (8 * i));  // explicit little-endian
  return prefix + text;
}

at::ScalarType safetensors_stored_dtype(const at::Tensor& tensor, at::ScalarType floating_as) {
  return floating_as != at::ScalarType::Undefined && at::isFloatingType(tensor.scalar_type()) ? floating_as : tensor.scalar_type();
}

FileWriteError::FileWriteError(const std::filesystem::path& file, const std::string& why)
    : UserError("cannot write " + file.string() + ": " + why), path(file), reason(why) {}
FileWriteError::~FileWriteError() = default;

void write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, const Metadata& metadata,
                       const WrittenBytes& written, at::ScalarType floating_as, const TensorWriteHooks& hooks) {
  refuse_overlaps(tensors);
  const std::string prefix = safetensors_prefix(tensors, metadata, floating_as);
  const std::filesystem::path tmp = path.string() + ".tmp";
  // The system's reason, and the partial file gone: a full disk keeps no half-written file.
  const auto refused = [&tmp]() {
    const std::string reason = errno ? std::strerror(errno) : "the write failed";
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return FileWriteError(tmp, reason);
  };
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw refused();
    const auto write = [&](const char* data, size_t size) {
      constexpr size_t kPiece = size_t{64} << 20;
      for (size_t at = 0; at < size; at += kPiece) {
        const size_t piece = std::min(kPiece, size - at);
        out.write(data + at, static_cast<std::streamsize>(piece));
        if (written) written(data + at, piece);
      }
    };
    write(prefix.data(), prefix.size());
    // One tensor at a time brought to host memory in row-major order (a transposed view, a device
    // tensor): what is written costs one tensor's copy at most, not a copy of them all.
    // A hook that throws (a tensor the checkpoint cannot fill) leaves no partial file either.
    try {
      for (const auto& [name, tensor] : tensors) {
        if (hooks.before) hooks.before(name);
        {
          at::Tensor bytes = tensor.detach();
          const at::ScalarType dtype = safetensors_stored_dtype(bytes, floating_as);
          if (!bytes.device().is_cpu() || bytes.scalar_type() != dtype || !bytes.is_contiguous())  // one copy: host, dtype, row-major at once
            bytes = at::empty(bytes.sizes(), at::TensorOptions().dtype(dtype)).copy_(bytes);
          write(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes());
        }
        if (hooks.after) hooks.after(name);
      }
    } catch (...) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw;
    }
    if (!out.flush()) throw refused();
  }
  engine::fsync_file(tmp);
  std::error_code renamed;
  std::filesystem::rename(tmp, path, renamed);
  if (renamed) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw FileWriteError(path, renamed.message());
  }
  engine::fsync_directory(path.parent_path());
}

NamedTensors parse_safetensors(const std::string& bytes, const std::string& label, Metadata* metadata) {
  return parse_safetensors(std::string_view(bytes), label, metadata);
}

namespace {

struct TensorEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// One tensor's header entry, checked: its dtype known, its shape's size within 64 bits, its data
// offsets spanning exactly the bytes its shape and dtype need.
TensorEntry tensor_entry(const std::string& name, const nlohmann::json& info, const std::string& label) {
  auto fail = [&](const std::string& why) -> UserError { return UserError("safetensors file " + label + ": " + why); };
  if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
    throw fail("tensor '" + name + "' needs dtype, shape and data_offsets");
  TensorEntry e{name, at::kFloat, {}, 0, 0};
  if (!info["dtype"].is_string()) throw fail("tensor '" + name + "' has a non-string dtype");
  auto dt = std::find_if(dtype_names().begin(), dtype_names().end(),
                         [&](const auto& p) { return p.first == info["dtype"].get<std::string>(); });
  if (dt == dtype_names().end()) throw fail("tensor '" + name + "' has unknown dtype " + info["dtype"].dump());
  e.dtype = dt->second;
  if (!info["shape"].is_array()) throw fail("tensor '" + name + "' shape is not a list");
  // Checked arithmetic: [2^32, 2^32, 0] or [2^63, 2] must not wrap into a plausible size. A zero
  // dimension empties the tensor but libtorch still computes strides from the others, so
  // [0, 2^62, 4] cannot be allocated either: the product is taken with zeros counted as one.
  int64_t extent = 1;
  bool empty = false, overflow = false;
  for (const auto& d : info["shape"]) {
    if (!d.is_number_unsigned()) throw fail("tensor '" + name + "' has a negative or non-integer dimension");
    const uint64_t size = d.get<uint64_t>();
    if (size > static_cast<uint64_t>(INT64_MAX)) throw fail("tensor '" + name + "' has a dimension of " + std::to_string(size) + ", too large");
    e.shape.push_back(static_cast<int64_t>(size));
    if (size == 0) empty = true;
    else overflow = overflow || __builtin_mul_overflow(extent, static_cast<int64_t>(size), &extent);
  }
  const uint64_t numel = empty ? 0 : static_cast<uint64_t>(extent);
  uint64_t needed = 0;
  if (overflow || __builtin_mul_overflow(numel, c10::elementSize(e.dtype), &needed))
    throw fail("tensor '" + name + "' has a shape whose size overflows 64 bits");
  const auto& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    throw fail("tensor '" + name + "' data_offsets must be two non-negative integers");
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.end < e.begin) throw fail("tensor '" + name + "' ends before it begins");
  if (e.end - e.begin != needed)
    throw fail("tensor '" + name + "' spans " + std::to_string(e.end - e.begin) + " bytes but its shape and dtype need " +
               std::to_string(needed));
  return e;
}

// Checks everything the format promises and returns the tensors, each made by
// `make(dtype, shape, data, bytes)` from its bytes in `bytes`, in file order.
using MakeTensor = std::function<at::Tensor(at::ScalarType dtype, const std::vector<int64_t>& shape, const char* data, size_t bytes)>;
NamedTensors parse(std::string_view bytes, const std::string& label, Metadata* metadata, const MakeTensor& make) {
  auto fail = [&](const std::string& why) -> UserError { return UserError("safetensors file " + label + ": " + why); };
  if (bytes.size() < 8) throw fail("shorter than its 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (header_len > kMaxHeader) throw fail("header length " + std::to_string(header_len) + " is over the 100000000-byte limit");
  if (8 + header_len > bytes.size()) throw fail("header runs past the end of the file");
  const std::string header_text(bytes.substr(8, header_len));
  if (header_text.empty() || header_text[0] != '{') throw fail("header is not a JSON object");
  // A header is three levels deep (object, tensor entry, shape list); anything far deeper is
  // hostile, and parsing or freeing it would recurse once per level.
  if (nesting_depth(header_text) > kMaxDepth) throw fail("header nests deeper than " + std::to_string(kMaxDepth) + " levels");

  // Two linear passes: SAX events find a repeated tensor name (a map would keep only the last),
  // then a plain parse. Not a parse callback, nor an ordered object: each rescans the object
  // built so far, n^2 for n tensors (minutes at 80,000). File order comes back from the data
  // offsets below.
  nlohmann::json header;
  try {
    TopLevelKeys keys;
    // On a syntax error the plain parse below throws, saying where.
    if (nlohmann::json::sax_parse(header_text, &keys) && keys.duplicate) throw fail("header names tensor '" + *keys.duplicate + "' twice");
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");

  std::vector<TensorEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw fail("__metadata__ must be an object of strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) throw fail("__metadata__ value of '" + k + "' is not a string");
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(tensor_entry(name, info, label));
  }
  // Sorted by offset the tensors must tile the data buffer exactly: no overlap, no hole.
  std::vector<const TensorEntry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return std::pair(a->begin, a->end) < std::pair(b->begin, b->end); });
  uint64_t expected = 0;
  for (const TensorEntry* e : by_offset) {
    if (e->begin < expected) throw fail("tensor '" + e->name + "' overlaps the tensor before it");
    if (e->begin > expected) throw fail("there is a hole in the data before tensor '" + e->name + "'");
    expected = e->end;
  }
  if (8 + header_len + expected != bytes.size())
    throw fail("file is " + std::to_string(bytes.size()) + " bytes but header and data account for " +
               std::to_string(8 + header_len + expected) + " (truncated or padded)");

  NamedTensors out;
  const char* data = bytes.data() + 8 + header_len;
  for (const TensorEntry* entry : by_offset)  // in file order
    out.emplace_back(entry->name, make(entry->dtype, entry->shape, data + entry->begin, entry->end - entry->begin));
  return out;
}

at::Tensor copy_of(at::ScalarType dtype, const std::vector<int64_t>& shape, const char* data, size_t bytes) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (bytes > 0) std::memcpy(t.data_ptr(), data, bytes);
  return t;
}

}  // namespace

NamedTensors parse_safetensors(std::string_view bytes, const std::string& label, Metadata* metadata) {
  return parse(bytes, label, metadata, copy_of);
}

NamedTensors view_safetensors(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& label, Metadata* metadata) {
  return parse(bytes, label, metadata, [&owner](at::ScalarType dtype, const std::vector<int64_t>& shape, const char* data, size_t size) {
    // A tensor whose bytes do not sit on its element size's boundary (the format does not
    // promise it) is copied rather than viewed misaligned.
    if (size == 0 || reinterpret_cast<uintptr_t>(data) % c10::elementSize(dtype) != 0) return copy_of(dtype, shape, data, size);
    return at::from_blob(const_cast<char*>(data), shape, [owner](void*) {}, at::TensorOptions().dtype(dtype));
  });
}

std::shared_ptr<const MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot read " + path.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw UserError("cannot read " + path.string() + ": " + std::strerror(error));
  }
  auto file = std::shared_ptr<MappedFile>(new MappedFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* data = ::mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      throw UserError("cannot map " + path.string() + ": " + std::strerror(error));
    }
    file->data_ = data;
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::release_pages(const void* begin, size_t bytes) const {
  // The pages stay in the page cache; this process stops counting them as resident.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto from = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const auto to = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  const auto start = reinterpret_cast<uintptr_t>(data_);
  // Only pages of this mapping (a tensor copied for its alignment lives elsewhere).
  if (!data_ || to <= from || from < start || to > start + size_) return;
  ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

NamedTensors read_safetensors(const std::filesystem::path& path, Metadata* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read safetensors file " + path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_safetensors(buffer.str(), path.string(), metadata);
}

}  // namespace strata
