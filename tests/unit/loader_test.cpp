// Loading plugin libraries: good ones register; bad ones are refused with a precise reason.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "strata/abi.h"
#include "strata/core/plugin_loader.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

fs::path plugin(const std::string& dir, const std::string& name) {
  return fs::path(STRATA_TEST_PLUGIN_DIR) / dir / ("strata_plugin_" + name + ".so");
}

std::string load_error(ComponentRegistry& registry, const fs::path& file) {
  try {
    PluginLoader(registry).load_file(file);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// A private copy of a plugin in a fresh directory whose permissions the test may change.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::path(STRATA_TEST_SCRATCH_DIR) / "loaderXXXXXX").string();
    fs::create_directories(STRATA_TEST_SCRATCH_DIR);
    path_ = ::mkdtemp(pattern.data());
    fs::permissions(path_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                               fs::perms::others_read | fs::perms::others_exec);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, ec);
    fs::remove_all(path_, ec);
  }
  fs::path copy_in(const fs::path& file) {
    fs::path target = path_ / file.filename();
    fs::copy_file(file, target);
    fs::permissions(target, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
    return target;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(Loader, LoadsAGoodPluginAndRecordsItsOrigin) {
  ComponentRegistry registry;
  EXPECT_EQ(load_error(registry, plugin("good", "good")), "");
  ASSERT_EQ(registry.plugins().size(), 1u);
  const PluginRecord& record = registry.plugins()[0];
  EXPECT_EQ(record.name, "good");
  EXPECT_EQ(record.version, "1.2.3");
  EXPECT_EQ(record.path, fs::canonical(plugin("good", "good")).string());
  ASSERT_NE(registry.find_pass("test_pass"), nullptr);
  EXPECT_EQ(registry.find_pass("test_pass")->info().schema.keys().at(0).key, "level");
  ASSERT_NE(registry.find(ComponentKind::Model, "test_model"), nullptr);
  EXPECT_EQ(registry.plugin_of(registry.find_pass("test_pass")), &record);
  // The same file twice (another spelling of the path included) loads once.
  EXPECT_EQ(load_error(registry, fs::path(STRATA_TEST_PLUGIN_DIR) / "good" / ".." / "good" / "strata_plugin_good.so"), "");
  EXPECT_EQ(registry.plugins().size(), 1u);
}

TEST(Loader, SearchPathLoadsDirectoriesAndRefusesMissingEntries) {
  ComponentRegistry registry;
  PluginLoader loader(registry);
  loader.load_search_path({fs::path(STRATA_TEST_PLUGIN_DIR) / "good"});
  EXPECT_NE(registry.find_pass("test_pass"), nullptr);
  try {
    loader.load_search_path({fs::path(STRATA_TEST_PLUGIN_DIR) / "nonexistent"});
    FAIL() << "missing entry accepted";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "plugin path entry")) << e.what();
    EXPECT_TRUE(contains(e.what(), "nonexistent does not exist"));
  }
}

TEST(Loader, RefusesAbiMismatchNamingBothVersions) {
  ComponentRegistry registry;
  std::string e = load_error(registry, plugin("abi_mismatch", "abi_mismatch"));
  const std::string host = std::to_string(STRATA_ABI_VERSION_MAJOR) + "." + std::to_string(STRATA_ABI_VERSION_MINOR);
  EXPECT_TRUE(contains(e, "was built for Strata plugin ABI " + std::to_string(STRATA_ABI_VERSION + 1) + ".x")) << e;
  EXPECT_TRUE(contains(e, "this strata uses ABI " + host)) << e;
  EXPECT_TRUE(contains(e, "rebuild the plugin"));
  // A newer minor may call what this host lacks: refused, naming both.
  e = load_error(registry, plugin("newer_minor", "newer_minor"));
  EXPECT_TRUE(contains(e, "was built for Strata plugin ABI " + std::to_string(STRATA_ABI_VERSION_MAJOR) + "." +
                              std::to_string(STRATA_ABI_VERSION_MINOR + 1) + ", newer than this strata's ABI " + host))
      << e;
  EXPECT_TRUE(registry.plugins().empty());
}

// A plugin from before 1.0: its integer version 1 reads as this major, but its descriptor ends
// before abi_minor, which every 1.x descriptor has. Refused by its size, naming the host's ABI.
// (An older minor of the same major loading is sdk.baseline_plugin's, once a minor was added.)
TEST(Loader, RefusesADescriptorFromBeforeOnePointZero) {
  ComponentRegistry registry;
  const std::string e = load_error(registry, plugin("before_1_0", "before_1_0"));
  EXPECT_TRUE(contains(e, "from before Strata plugin ABI 1.0 (this strata uses ABI " + std::to_string(STRATA_ABI_VERSION_MAJOR) +
                              "." + std::to_string(STRATA_ABI_VERSION_MINOR) + ")")) << e;
  EXPECT_TRUE(registry.plugins().empty());
}

TEST(Loader, RefusesLibtorchAndCxxAbiMismatch) {
  ComponentRegistry registry;
  EXPECT_TRUE(contains(load_error(registry, plugin("torch_mismatch", "torch_mismatch")),
                       "built against libtorch 1.13.0 but this strata uses libtorch " STRATA_TORCH_VERSION_STRING));
  EXPECT_TRUE(contains(load_error(registry, plugin("cxx_abi_mismatch", "cxx_abi_mismatch")),
                       "built with C++ ABI 'libstdc++-pre-cxx11'"));
  EXPECT_TRUE(registry.plugins().empty());
}

TEST(Loader, RefusesLibraryWithoutEntryPoint) {
  ComponentRegistry registry;
  std::string e = load_error(registry, plugin("no_entry", "no_entry"));
  EXPECT_TRUE(contains(e, "strata_plugin_no_entry.so is not a Strata plugin: it exports no 'strata_plugin_descriptor'"));
}

TEST(Loader, RefusesFilesThatAreNotLibraries) {
  ScratchDir dir;
  fs::path fake = dir.path() / "strata_plugin_fake.so";
  std::ofstream(fake) << "not an ELF file";
  fs::permissions(fake, fs::perms::owner_read | fs::perms::owner_write);
  ComponentRegistry registry;
  EXPECT_TRUE(contains(load_error(registry, fake), "cannot load plugin " + fs::canonical(fake).string()));
}

TEST(Loader, RefusesDuplicateComponentNamingBothPlugins) {
  ComponentRegistry registry;
  ASSERT_EQ(load_error(registry, plugin("good", "good")), "");
  std::string e = load_error(registry, plugin("duplicate", "duplicate"));
  EXPECT_TRUE(contains(e, "pass 'test_pass' is registered by both plugin 'good'"));
  EXPECT_TRUE(contains(e, "and plugin 'duplicate'"));
  EXPECT_EQ(registry.plugins().size(), 1u);
}

TEST(Loader, RefusesDuplicatePluginName) {
  ComponentRegistry registry;
  ASSERT_EQ(load_error(registry, plugin("good", "good")), "");
  std::string e = load_error(registry, plugin("same_name", "same_name"));
  EXPECT_TRUE(contains(e, "plugin name 'good' is used by both"));
  EXPECT_TRUE(contains(e, "strata_plugin_same_name.so"));
}

TEST(Loader, FailedRegistrationLeavesNothingBehind) {
  ComponentRegistry registry;
  std::string e = load_error(registry, plugin("throwing", "throwing"));
  EXPECT_TRUE(contains(e, "failed while registering its components: boom while registering"));
  EXPECT_EQ(registry.find(ComponentKind::Communicator, "half_registered"), nullptr);
  EXPECT_TRUE(registry.plugins().empty());
}

TEST(Loader, RefusesPluginInWorldWritableDirectory) {
  ScratchDir dir;
  fs::path copy = dir.copy_in(plugin("good", "good"));
  ComponentRegistry registry;
  EXPECT_EQ(load_error(registry, copy), "") << "a private copy should load";

  ScratchDir open_dir;
  fs::path exposed = open_dir.copy_in(plugin("good", "good"));
  fs::permissions(open_dir.path(), fs::perms::all);  // 0777
  ComponentRegistry fresh;
  std::string e = load_error(fresh, exposed);
  EXPECT_TRUE(contains(e, "refusing to load plugin"));
  EXPECT_TRUE(contains(e, "directory " + fs::canonical(open_dir.path()).string() + " is writable by other users (mode 0777)"));
  EXPECT_TRUE(fresh.plugins().empty());
}

// Whoever can write a directory chooses where a symlink in it points: a link in a world-writable
// directory is refused even when it points at a trusted library, and nothing is opened.
TEST(Loader, RefusesSymlinkInWorldWritableDirectoryToTrustedLibrary) {
  ScratchDir trusted;
  const fs::path library = trusted.copy_in(plugin("good", "good"));
  ScratchDir open_dir;
  fs::permissions(open_dir.path(), fs::perms::all);  // 0777, not sticky
  const fs::path link = open_dir.path() / "strata_plugin_good.so";
  fs::create_symlink(library, link);
  ComponentRegistry registry;
  std::string e = load_error(registry, link);
  EXPECT_TRUE(contains(e, "refusing to load plugin " + link.string())) << e;
  EXPECT_TRUE(contains(e, "is writable by other users (mode 0777)")) << e;
  EXPECT_TRUE(registry.plugins().empty());
  ComponentRegistry direct;
  EXPECT_EQ(load_error(direct, library), "") << "the library itself is trusted";
}

TEST(Loader, RefusesGroupWritablePluginFile) {
  ScratchDir dir;
  fs::path copy = dir.copy_in(plugin("good", "good"));
  fs::permissions(copy, fs::perms::group_write, fs::perm_options::add);
  ComponentRegistry registry;
  EXPECT_TRUE(contains(load_error(registry, copy), "file " + fs::canonical(copy).string() + " is writable by other users"));
}

TEST(Loader, StickyAncestorIsAcceptedButNotAsTheDirectItself) {
  ScratchDir sticky;
  fs::permissions(sticky.path(), fs::perms::all | fs::perms::sticky_bit);  // like /tmp
  fs::path inner = sticky.path() / "inner";
  fs::create_directory(inner);
  fs::permissions(inner, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec);
  fs::copy_file(plugin("good", "good"), inner / "strata_plugin_good.so");
  EXPECT_EQ(untrusted_reason(inner / "strata_plugin_good.so"), std::nullopt);
  fs::copy_file(plugin("good", "good"), sticky.path() / "strata_plugin_good.so");
  EXPECT_NE(untrusted_reason(sticky.path() / "strata_plugin_good.so"), std::nullopt);
}

}  // namespace
}  // namespace strata
