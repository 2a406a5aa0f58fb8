// Finding, vetting and loading plugin libraries.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/component_registry.h"

namespace strata {

// Plugin files are named strata_plugin_<name>.so; nothing else in a plugin directory is opened.
inline constexpr const char* kPluginFilePrefix = "strata_plugin_";
inline constexpr const char* kPluginFileSuffix = ".so";

// Why `file` must not be loaded, or nullopt when it may be. Like sshd's StrictModes: the file and
// every directory above it must belong to root or to us and must not be writable by group or
// others; the one exception is a sticky ancestor such as /tmp, which others cannot rename into.
// Both the path as given (the directories that hold a symlink, and the link's owner) and the
// file it resolves to are checked.
STRATA_API std::optional<std::string> untrusted_reason(const std::filesystem::path& file);

// The directory bundled plugins live in: <libdir>/strata/plugins next to libstrata_core.
STRATA_API std::filesystem::path installed_plugin_dir();

// Search order: STRATA_PLUGIN_PATH (colon separated), then the strategy's plugin_path, then the
// installed plugin directory. Each entry is a directory or a plugin file.
STRATA_API std::vector<std::filesystem::path> plugin_search_path(const std::vector<std::filesystem::path>& strategy_plugin_path);

class STRATA_API PluginLoader {
 public:
  explicit PluginLoader(ComponentRegistry& registry) : registry_(registry) {}

  // Loads every plugin file in each entry. A file already in the registry (same real path) is skipped.
  // The installed directory may be missing; any other missing entry is an error.
  void load_search_path(const std::vector<std::filesystem::path>& entries);
  void load_file(const std::filesystem::path& file);

 private:
  ComponentRegistry& registry_;
};

}  // namespace strata
