// The plugin ABI: one version integer and one exported C entry point per plugin.
//
// Rule: STRATA_ABI_VERSION changes whenever anything a plugin can see changes layout or meaning
// (these headers, the descriptor, virtual tables of the component interfaces). The host refuses
// a plugin whose version differs in either direction; there is no partial compatibility.
#pragma once

#include <cstdint>

#include <torch/headeronly/version.h>

#include "strata/export.h"

#define STRATA_ABI_VERSION 23

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
// Field order is frozen: the host reads abi_version before anything else, so it must stay first
// in every ABI version, and struct_size second.
struct StrataPluginDescriptor {
  uint32_t abi_version;
  uint32_t struct_size;
  const char* name;
  const char* version;
  const char* torch_version;
  const char* cxx_abi;
  void (*register_components)(strata::Registry& registry);
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
                                                   &REGISTER_FN};                                \
    return &descriptor;                                                                          \
  }
