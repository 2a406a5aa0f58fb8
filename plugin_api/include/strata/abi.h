// The plugin ABI: a version MAJOR.MINOR and one exported C entry point per plugin.
//
// Rule (docs/plugin-abi.md): MAJOR changes whenever anything a plugin can see changes layout or
// meaning (these headers' classes and functions, the descriptor's frozen fields, virtual tables of
// the component interfaces); MINOR grows when something is only added (a function, a class, a new
// interface a plugin may implement and core finds by dynamic_cast). A host M.n loads a plugin
// built for M.m when m <= n and refuses any other, naming both versions.
#pragma once

#include <cstdint>

#include <torch/headeronly/version.h>

#include "strata/export.h"

#define STRATA_ABI_VERSION_MAJOR 1
#define STRATA_ABI_VERSION_MINOR 9
// The descriptor's first field, which every host (also those before MINOR existed) compares with
// its own: the major.
#define STRATA_ABI_VERSION STRATA_ABI_VERSION_MAJOR

#define STRATA_STRINGIFY_IMPL(x) #x
#define STRATA_STRINGIFY(x) STRATA_STRINGIFY_IMPL(x)

// libtorch's own C++ API is not stable across releases, so a plugin must match the host's.
#define STRATA_TORCH_VERSION_STRING \
  STRATA_STRINGIFY(TORCH_VERSION_MAJOR) "." STRATA_STRINGIFY(TORCH_VERSION_MINOR) "." STRATA_STRINGIFY(TORCH_VERSION_PATCH)

// std::string and friends change layout with libstdc++'s dual ABI.
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
#define STRATA_CXX_ABI_TAG "libstdc++-cxx11"
#elif defined(__GLIBCXX__)
#define STRATA_CXX_ABI_TAG "libstdc++-pre-cxx11"
#else
#define STRATA_CXX_ABI_TAG "unknown"
#endif

#define STRATA_PLUGIN_ENTRY_SYMBOL "strata_plugin_descriptor"

namespace strata {
class Registry;
}

extern "C" {
// Field order is frozen: the host reads abi_version (the major) before anything else, so it must
// stay first in every ABI version, and struct_size second; fields are only ever appended, and a
// host reads an appended one only where struct_size covers it. Every 1.x descriptor has
// abi_minor (the integer versions before 1.0 had no such field, and are refused by their size).
struct StrataPluginDescriptor {
  uint32_t abi_version;
  uint32_t struct_size;
  const char* name;
  const char* version;
  const char* torch_version;
  const char* cxx_abi;
  void (*register_components)(strata::Registry& registry);
  uint32_t abi_minor;
};
}

// Declares the plugin's entry point. Use once per plugin, at namespace scope:
//   STRATA_PLUGIN("fsdp", "0.1.0", register_fsdp)
#define STRATA_PLUGIN(NAME, VERSION, REGISTER_FN)                                                 \
  extern "C" STRATA_EXPORT const StrataPluginDescriptor* strata_plugin_descriptor() {             \
    static const StrataPluginDescriptor descriptor{STRATA_ABI_VERSION,                           \
                                                   sizeof(StrataPluginDescriptor),               \
                                                   NAME,                                         \
                                                   VERSION,                                      \
                                                   STRATA_TORCH_VERSION_STRING,                  \
                                                   STRATA_CXX_ABI_TAG,                           \
                                                   &REGISTER_FN,                                 \
                                                   STRATA_ABI_VERSION_MINOR};                    \
    return &descriptor;                                                                          \
  }
