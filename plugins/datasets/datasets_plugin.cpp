// Datasets: token files (memory-mapped), byte-level text and synthetic tokens.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "strata/plugin.h"

namespace strata::datasets {
namespace {

namespace fs = std::filesystem;

fs::path resolve(const std::string& path, const DataContext& context) {
  fs::path p(path);
  return p.is_absolute() ? p : context.base_dir / p;
}

// A read-only memory map of a whole file, unmapped when the last reader goes.
class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw UserError("[data] cannot open " + path.string() + ": " + std::strerror(errno));
    struct stat st {};
    ::fstat(fd, &st);
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (data_ == MAP_FAILED) throw UserError("[data] cannot map " + path.string() + ": " + std::strerror(errno));
  }
  ~MappedFile() {
    if (data_ && data_ != MAP_FAILED) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* bytes() const { return static_cast<const unsigned char*>(data_); }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Mapped files read as one byte stream, in order: a directory of text files costs no memory of its
// own, as one file does (reading them into one buffer took the corpus's size on every rank).
class MappedStream {
 public:
  explicit MappedStream(const std::vector<fs::path>& files) {
    for (const auto& file : files) {
      auto mapped = std::make_shared<const MappedFile>(file);
      if (mapped->size() == 0) continue;
      starts_.push_back(size_);
      size_ += mapped->size();
      files_.push_back(std::move(mapped));
    }
  }
  size_t size() const { return size_; }
  size_t file_size(size_t i) const { return files_[i]->size(); }
  // Bytes [offset, offset + n): a pointer into the one file that holds them all, or, where they
  // span files, a copy in `spill`.
  const unsigned char* bytes(size_t offset, size_t n, std::vector<unsigned char>& spill) const {
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
    if (offset + n <= starts_[i] + files_[i]->size()) return files_[i]->bytes() + (offset - starts_[i]);
    spill.resize(n);
    for (size_t done = 0; done < n; ++i) {
      const size_t from = offset + done - starts_[i], take = std::min(n - done, files_[i]->size() - from);
      std::memcpy(spill.data() + done, files_[i]->bytes() + from, take);
      done += take;
    }
    return spill.data();
  }

 private:
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<size_t> starts_;
  size_t size_ = 0;
};

// Tokens of fixed width (1, 2 or 4 bytes, little-endian) in mapped files, split into train and
// validation ranges.
class FixedWidthTokens final : public TokenDataset {
 public:
  struct Range {
    std::shared_ptr<const MappedStream> source;
    int64_t first = 0, count = 0;  // in tokens
  };

  FixedWidthTokens(int width, int64_t vocab, Range train, Range val)
      : width_(width), vocab_(vocab), train_(std::move(train)), val_(std::move(val)) {}

  int64_t vocab_size() const override { return vocab_; }
  int64_t num_tokens(Split split) const override { return range(split).count; }

  void read(Split split, int64_t begin, int64_t count, int64_t* out) const override {
    const Range& r = range(split);
    if (begin < 0 || begin + count > r.count) throw std::out_of_range("token read past the end of the split");
    if (count == 0) return;
    std::vector<unsigned char> spill;
    const unsigned char* base = r.source->bytes(static_cast<size_t>((r.first + begin) * width_), static_cast<size_t>(count * width_), spill);
    for (int64_t i = 0; i < count; ++i) {
      const unsigned char* p = base + i * width_;
      uint32_t v = p[0];
      if (width_ >= 2) v |= static_cast<uint32_t>(p[1]) << 8;
      if (width_ == 4) v |= static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
      out[i] = v;
    }
  }

 private:
  const Range& range(Split split) const { return split == Split::Train ? train_ : val_; }
  int width_;
  int64_t vocab_;
  Range train_, val_;
};

// The last val_fraction of a stream is held out.
std::pair<FixedWidthTokens::Range, FixedWidthTokens::Range> split_tail(FixedWidthTokens::Range all, double val_fraction) {
  const int64_t val = static_cast<int64_t>(static_cast<double>(all.count) * val_fraction);
  FixedWidthTokens::Range train = all, held = all;
  train.count = all.count - val;
  held.first = all.first + train.count;
  held.count = val;
  return {train, held};
}

// Packed documents: core reads these two keys of every dataset (Job::split_batch).
Schema packing_keys(Schema schema) {
  return schema
      .integer("document_end", -1,
               "Token id that ends each document of packed data: attention never crosses it (-1: the stream is one document)",
               at_least(-1))
      .boolean("reset_positions", false, "Position ids restart at 0 at each document's first token (needs document_end)");
}

constexpr double kDefaultValFraction = 0.05;

Schema split_keys(Schema schema) {
  return packing_keys(
      schema.real("val_fraction", kDefaultValFraction, "Share of the stream held out for evaluation (its tail)", between(0, 0.5)));
}

class Tokens final : public DatasetFactory {
 public:
  Tokens()
      : DatasetFactory({ComponentKind::Dataset, "tokens",
                        "Memory-mapped token files: raw little-endian uint16 (nanoGPT) or uint32 streams",
                        split_keys(Schema()
                                       .required_string("path", "Token file, or a directory holding train.bin and val.bin (relative: to the working directory; saved absolute)")
                                       .string("dtype", "uint16", "Token width in the file", {"uint16", "uint32"})
                                       .integer("vocab_size", 0, "Vocabulary size; 0 = largest token id + 1 found by a scan", at_least(0)))}) {}

  // A directory's val.bin is the validation split: a val_fraction stated for it would be read by
  // nothing (the default is kept: a saved strategy states every key).
  void validate(const Config& c, const SourcePos& section, Diagnostics& diagnostics) const override {
    DatasetFactory::validate(c, section, diagnostics);
    std::error_code unreadable;
    if (c.has("val_fraction") && c.get_float("val_fraction") != kDefaultValFraction && c.has("path") &&
        fs::is_directory(c.get_string("path"), unreadable))
      diagnostics.error(c.entry("val_fraction").pos, "[data] val_fraction holds out the tail of a single token file, and " +
                                                         c.get_string("path") +
                                                         " is a directory, whose val.bin is the validation split; remove val_fraction (`strata data "
                                                         "prepare --val-fraction` chooses a prepared directory's split)");
  }

  std::unique_ptr<TokenDataset> open(const Config& c, const DataContext& context) const override {
    const int width = c.get_string("dtype") == "uint16" ? 2 : 4;
    const fs::path path = resolve(c.get_string("path"), context);
    auto map = [&](const fs::path& file) {
      auto mapped = std::make_shared<const MappedStream>(std::vector<fs::path>{file});
      if (mapped->size() % width != 0)
        throw UserError("[data] " + file.string() + " has " + std::to_string(mapped->size()) +
                        " bytes, not a whole number of " + c.get_string("dtype") + " tokens");
      return FixedWidthTokens::Range{mapped, 0, static_cast<int64_t>(mapped->size() / width)};
    };
    FixedWidthTokens::Range train, val;
    if (fs::is_directory(path)) {
      train = map(path / "train.bin");
      val = map(path / "val.bin");
    } else {
      std::tie(train, val) = split_tail(map(path), c.get_float("val_fraction"));
    }
    auto data = std::make_unique<FixedWidthTokens>(width, c.get_int("vocab_size"), train, val);
    if (c.get_int("vocab_size") == 0) data = std::make_unique<FixedWidthTokens>(width, scan_vocab(*data), train, val);
    return data;
  }

 private:
  static int64_t scan_vocab(const TokenDataset& data) {
    int64_t largest = 0;
    std::vector<int64_t> chunk(1 << 16);
    for (Split split : {Split::Train, Split::Val})
      for (int64_t begin = 0; begin < data.num_tokens(split); begin += static_cast<int64_t>(chunk.size())) {
        int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), data.num_tokens(split) - begin);
        data.read(split, begin, n, chunk.data());
        largest = std::max(largest, *std::max_element(chunk.begin(), chunk.begin() + n));
      }
    return largest + 1;
  }
};

class Text final : public DatasetFactory {
 public:
  Text()
      : DatasetFactory({ComponentKind::Dataset, "text", "Byte-level tokens (vocabulary 256) of UTF-8 text files",
                        split_keys(Schema().required_string("path", "Text file, or a directory whose .txt files are read in name order (relative: to the working directory; saved absolute)"))}) {}

  std::unique_ptr<TokenDataset> open(const Config& c, const DataContext& context) const override {
    const fs::path path = resolve(c.get_string("path"), context);
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::directory_iterator(path))
        if (entry.path().extension() == ".txt") files.push_back(entry.path());
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    // Mapped, as token files are: opening them costs nothing, however large (strata tune opens the
    // data once per candidate it plans), and the ranks of a machine share the pages.
    for (const auto& file : files)
      if (!fs::is_regular_file(file)) throw UserError("[data] cannot read " + file.string());
    auto stream = std::make_shared<const MappedStream>(files);
    const FixedWidthTokens::Range all{stream, 0, static_cast<int64_t>(stream->size())};
    if (all.count < 2) {
      // A directory `strata data prepare` wrote is token files, not text: name the dataset for it.
      const bool prepared = fs::is_directory(path) && fs::exists(path / "meta.json");
      throw UserError("[data] " + path.string() + (fs::is_directory(path) ? " holds no .txt file" : " holds no text") +
                      (prepared ? "; it holds the token files strata data prepare wrote, which [job] dataset = \"tokens\" reads "
                                  "(left out, it is chosen from the path)"
                                : ""));
    }
    auto [train, val] = split_tail(all, c.get_float("val_fraction"));
    return std::make_unique<FixedWidthTokens>(1, 256, train, val);
  }
};

// Uniformly random tokens from a fixed seed: the same stream on every run and rank.
class SyntheticTokens final : public TokenDataset {
 public:
  SyntheticTokens(int64_t vocab, int64_t count, uint64_t seed) : vocab_(vocab) {
    std::mt19937_64 rng(seed);
    tokens_.resize(static_cast<size_t>(count));
    for (auto& t : tokens_) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    val_begin_ = count - count / 20;
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t num_tokens(Split split) const override {
    return split == Split::Train ? val_begin_ : static_cast<int64_t>(tokens_.size()) - val_begin_;
  }
  void read(Split split, int64_t begin, int64_t count, int64_t* out) const override {
    const int64_t offset = (split == Split::Train ? 0 : val_begin_) + begin;
    std::copy_n(tokens_.begin() + offset, count, out);
  }

 private:
  int64_t vocab_;
  std::vector<int64_t> tokens_;
  int64_t val_begin_ = 0;
};

class Synthetic final : public DatasetFactory {
 public:
  Synthetic()
      : DatasetFactory({ComponentKind::Dataset, "synthetic", "Random tokens for benchmarks (the last 5% are the validation split)",
                        packing_keys(Schema()
                                         .integer("vocab_size", 50257, "Token ids are drawn from [0, vocab_size)", at_least(1))
                                         .integer("num_tokens", 1 << 20, "Tokens in the stream", at_least(2))
                                         .integer("seed", 0, "Seed of the stream (independent of [job] seed)", at_least(0)))}) {}

  std::unique_ptr<TokenDataset> open(const Config& c, const DataContext&) const override {
    return std::make_unique<SyntheticTokens>(c.get_int("vocab_size"), c.get_int("num_tokens"),
                                             static_cast<uint64_t>(c.get_int("seed")));
  }
};

void register_components(Registry& registry) {
  registry.add(std::make_unique<Tokens>());
  registry.add(std::make_unique<Text>());
  registry.add(std::make_unique<Synthetic>());
}

}  // namespace
}  // namespace strata::datasets

STRATA_PLUGIN("datasets", "0.2.0", strata::datasets::register_components)
