// The bundled datasets read what nanoGPT-style token files and text files hold.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "strata/core/plugin_loader.h"
#include "strata/data.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const DatasetFactory& dataset(const std::string& name) {
  static ComponentRegistry* registry = [] {
    auto* r = new ComponentRegistry();
    PluginLoader(*r).load_search_path({installed_plugin_dir()});
    return r;
  }();
  return *dynamic_cast<const DatasetFactory*>(registry->find(ComponentKind::Dataset, name));
}

Config config(const DatasetFactory& factory, std::map<std::string, Value> values) {
  Config c;
  for (const auto& spec : factory.info().schema.keys()) {
    auto it = values.find(spec.key);
    c.set(spec.key, Config::Entry{it != values.end() ? it->second : *spec.default_value, Origin::Default, {}});
  }
  return c;
}

template <class T>
void write_tokens(const fs::path& path, const std::vector<T>& tokens) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()),
                                               static_cast<std::streamsize>(tokens.size() * sizeof(T)));
}

std::vector<int64_t> read(const TokenDataset& d, Split split) {
  std::vector<int64_t> out(static_cast<size_t>(d.num_tokens(split)));
  d.read(split, 0, d.num_tokens(split), out.data());
  return out;
}

class Datasets : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_datasets_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Datasets, Uint16FileSplitsItsTailAndScansTheVocabulary) {
  std::vector<uint16_t> tokens;
  for (uint16_t i = 0; i < 100; ++i) tokens.push_back(static_cast<uint16_t>(i * 600));  // up to 59400
  write_tokens(dir_ / "t.bin", tokens);
  auto d = dataset("tokens").open(config(dataset("tokens"), {{"path", (dir_ / "t.bin").string()}, {"val_fraction", 0.1}}), {});
  EXPECT_EQ(d->num_tokens(Split::Train), 90);
  EXPECT_EQ(d->num_tokens(Split::Val), 10);
  EXPECT_EQ(read(*d, Split::Train)[89], 89 * 600);
  EXPECT_EQ(read(*d, Split::Val)[0], 90 * 600);
  EXPECT_EQ(d->vocab_size(), 99 * 600 + 1);
}

TEST_F(Datasets, Uint32DirectoryWithTrainAndVal) {
  write_tokens<uint32_t>(dir_ / "train.bin", {70000, 1, 2, 3});
  write_tokens<uint32_t>(dir_ / "val.bin", {5, 6});
  auto d = dataset("tokens").open(
      config(dataset("tokens"), {{"path", dir_.string()}, {"dtype", std::string("uint32")}, {"vocab_size", int64_t{80000}}}), {});
  EXPECT_EQ(read(*d, Split::Train), (std::vector<int64_t>{70000, 1, 2, 3}));
  EXPECT_EQ(read(*d, Split::Val), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(d->vocab_size(), 80000);
}

TEST_F(Datasets, TornTokenFileAndMissingFileAreUserErrors) {
  std::ofstream(dir_ / "odd.bin", std::ios::binary) << "abc";
  try {
    dataset("tokens").open(config(dataset("tokens"), {{"path", (dir_ / "odd.bin").string()}}), {});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has 3 bytes, not a whole number of uint16 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dataset("text").open(config(dataset("text"), {{"path", (dir_ / "none.txt").string()}}), {}), UserError);
}

TEST_F(Datasets, TextIsBytesAndSyntheticIsSeeded) {
  std::ofstream(dir_ / "a.txt") << "hello world, hello strata";
  auto text = dataset("text").open(config(dataset("text"), {{"path", dir_.string()}, {"val_fraction", 0.2}}), {});
  EXPECT_EQ(text->vocab_size(), 256);
  EXPECT_EQ(read(*text, Split::Train)[0], 'h');
  auto s1 = dataset("synthetic").open(config(dataset("synthetic"), {{"num_tokens", int64_t{1000}}}), {});
  auto s2 = dataset("synthetic").open(config(dataset("synthetic"), {{"num_tokens", int64_t{1000}}}), {});
  EXPECT_EQ(read(*s1, Split::Train), read(*s2, Split::Train));
}

// A directory's text files are one byte stream in name order (mapped, not read into memory):
// every read, whichever files it spans (an empty one among them), gives the concatenation's bytes,
// and the validation tail is the concatenation's.
TEST_F(Datasets, TextDirectoryIsItsFilesInNameOrder) {
  const std::vector<std::pair<std::string, std::string>> files{
      {"b.txt", "second file, "}, {"a.txt", "first file; "}, {"c.txt", ""}, {"d.txt", "the fourth and last."}, {"e.md", "not read"}};
  for (const auto& [name, body] : files) std::ofstream(dir_ / name) << body;
  const std::string whole = "first file; second file, the fourth and last.";
  auto text = dataset("text").open(config(dataset("text"), {{"path", dir_.string()}, {"val_fraction", 0.25}}), {});
  const int64_t train = text->num_tokens(Split::Train), val = text->num_tokens(Split::Val);
  ASSERT_EQ(train + val, static_cast<int64_t>(whole.size()));
  EXPECT_EQ(val, static_cast<int64_t>(whole.size() / 4));
  std::string all;
  for (int64_t v : read(*text, Split::Train)) all += static_cast<char>(v);
  for (int64_t v : read(*text, Split::Val)) all += static_cast<char>(v);
  EXPECT_EQ(all, whole);
  for (int64_t begin = 0; begin < train; ++begin)
    for (int64_t count = 0; begin + count <= train; count += 7) {
      std::vector<int64_t> out(static_cast<size_t>(count));
      text->read(Split::Train, begin, count, out.data());
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], whole[static_cast<size_t>(begin + i)]) << begin << "+" << i;
    }
  std::vector<int64_t> one(1);
  EXPECT_THROW(text->read(Split::Val, val, 1, one.data()), std::out_of_range);
}

}  // namespace
}  // namespace strata
