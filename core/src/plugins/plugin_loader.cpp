#include "strata/core/plugin_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <boost/dll/shared_library.hpp>

#include "strata/abi.h"
#include "strata/core/log.h"
#include "strata/errors.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// Plugin code must stay mapped for as long as any component it created can be reached, which
// is until the process exits; so handles are kept here and never closed.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libraries = new std::vector<boost::dll::shared_library>();
  return *libraries;
}

bool is_plugin_file_name(const std::string& name) {
  const std::string prefix = kPluginFilePrefix, suffix = kPluginFileSuffix;
  return name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string safe_string(const char* s) { return s ? std::string(s) : std::string(); }

// The fields every descriptor of this major has, abi_minor the last of them. A plugin from before
// 1.0 (an integer version, also 1 in the first days) has a shorter descriptor without it.
constexpr size_t kFrozenDescriptorBytes = offsetof(StrataPluginDescriptor, abi_minor) + sizeof(uint32_t);

const std::string kHostAbi = std::to_string(STRATA_ABI_VERSION_MAJOR) + "." + std::to_string(STRATA_ABI_VERSION_MINOR);

uint32_t abi_minor_of(const StrataPluginDescriptor* d) { return d->struct_size >= kFrozenDescriptorBytes ? d->abi_minor : 0; }

void check_descriptor(const StrataPluginDescriptor* d, const std::string& path) {
  if (!d) throw UserError("plugin " + path + ": its entry point returned no descriptor");
  // Nothing but abi_version may be read before the major matches: the layout may differ.
  if (d->abi_version != STRATA_ABI_VERSION_MAJOR)
    throw UserError("plugin " + path + " was built for Strata plugin ABI " + std::to_string(d->abi_version) +
                    ".x but this strata uses ABI " + kHostAbi + "; rebuild the plugin against this Strata's SDK");
  if (d->struct_size < kFrozenDescriptorBytes)
    throw UserError("plugin " + path + " has a descriptor of " + std::to_string(d->struct_size) +
                    " bytes, from before Strata plugin ABI 1.0 (this strata uses ABI " + kHostAbi +
                    "); rebuild the plugin against this Strata's SDK");
  // A plugin built for a newer minor may call what this host lacks.
  if (abi_minor_of(d) > STRATA_ABI_VERSION_MINOR)
    throw UserError("plugin " + path + " was built for Strata plugin ABI " + std::to_string(d->abi_version) + "." +
                    std::to_string(abi_minor_of(d)) + ", newer than this strata's ABI " + kHostAbi +
                    "; update strata, or rebuild the plugin against this Strata's SDK");
  if (safe_string(d->name).empty() || !d->register_components)
    throw UserError("plugin " + path + " has a descriptor without a name or register function");
  if (safe_string(d->torch_version) != STRATA_TORCH_VERSION_STRING)
    throw UserError("plugin " + path + " ('" + d->name + "') was built against libtorch " + safe_string(d->torch_version) +
                    " but this strata uses libtorch " STRATA_TORCH_VERSION_STRING "; rebuild the plugin");
  if (safe_string(d->cxx_abi) != STRATA_CXX_ABI_TAG)
    throw UserError("plugin " + path + " ('" + d->name + "') was built with C++ ABI '" + safe_string(d->cxx_abi) +
                    "' but this strata uses '" STRATA_CXX_ABI_TAG "'; rebuild the plugin with the same toolchain");
}

}  // namespace

fs::path installed_plugin_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&installed_plugin_dir), &info) == 0 || !info.dli_fname) return {};
  return fs::path(info.dli_fname).parent_path() / "strata" / "plugins";
}

std::vector<fs::path> plugin_search_path(const std::vector<fs::path>& strategy_plugin_path) {
  std::vector<fs::path> out;
  if (const char* env = std::getenv("STRATA_PLUGIN_PATH")) {
    std::stringstream entries(env);
    std::string entry;
    while (std::getline(entries, entry, ':'))
      if (!entry.empty()) out.emplace_back(entry);
  }
  out.insert(out.end(), strategy_plugin_path.begin(), strategy_plugin_path.end());
  out.push_back(installed_plugin_dir());
  return out;
}

void PluginLoader::load_search_path(const std::vector<fs::path>& entries) {
  const fs::path installed = installed_plugin_dir();
  for (const auto& entry : entries) {
    std::error_code ec;
    if (fs::is_directory(entry, ec)) {
      std::vector<fs::path> files;
      for (const auto& item : fs::directory_iterator(entry, ec))
        if (is_plugin_file_name(item.path().filename().string())) files.push_back(item.path());
      if (ec) throw UserError("cannot list plugin directory " + entry.string() + ": " + ec.message());
      std::sort(files.begin(), files.end());  // load order decides nothing, but keep it stable
      for (const auto& file : files) load_file(file);
    } else if (fs::is_regular_file(entry, ec)) {
      load_file(entry);
    } else if (entry != installed) {
      throw UserError("plugin path entry " + entry.string() + " does not exist");
    }
  }
}

void PluginLoader::load_file(const fs::path& file) {
  std::error_code ec;
  fs::path real = fs::canonical(file, ec);
  if (ec) throw UserError("cannot open plugin " + file.string() + ": " + ec.message());
  const std::string path = real.string();
  for (const auto& plugin : registry_.plugins())
    if (plugin.path == path) return;

  // Checked before anything is opened, on the path as found (a link's directory) and resolved.
  if (auto why = untrusted_reason(file)) throw UserError("refusing to load plugin " + file.string() + ": " + *why);

  boost::dll::shared_library library;
  try {
    library.load(real, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw UserError("cannot load plugin " + path + ": " + e.what());
  }
  if (!library.has(STRATA_PLUGIN_ENTRY_SYMBOL))
    throw UserError(path + " is not a Strata plugin: it exports no '" STRATA_PLUGIN_ENTRY_SYMBOL
                    "' entry point (declare one with STRATA_PLUGIN)");
  auto& entry = library.get<const StrataPluginDescriptor*()>(STRATA_PLUGIN_ENTRY_SYMBOL);
  const StrataPluginDescriptor* descriptor = entry();
  check_descriptor(descriptor, path);

  PluginRecord record{descriptor->name, safe_string(descriptor->version), path, descriptor->torch_version, {},
                      std::to_string(descriptor->abi_version) + "." + std::to_string(abi_minor_of(descriptor))};
  loaded_libraries().push_back(std::move(library));
  registry_.register_plugin(std::move(record), descriptor->register_components);
  log::debug("loaded plugin '" + std::string(descriptor->name) + "' from " + path);
}

}  // namespace strata
