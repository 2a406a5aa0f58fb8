// A plugin whose descriptor disagrees with the host: built "for" another ABI major, a newer ABI
// minor, another libtorch or C++ ABI; or one from before the descriptor carried a minor (its
// struct ends before abi_minor), which a host of the same major loads as minor 0. The build picks
// the case with FOREIGN_FIELD.
#include <cstddef>

#include "strata/plugin.h"

namespace {
void register_components(strata::Registry&) {}
}  // namespace

extern "C" STRATA_EXPORT const StrataPluginDescriptor* strata_plugin_descriptor() {
  static const StrataPluginDescriptor descriptor{
#if FOREIGN_FIELD == 1
      STRATA_ABI_VERSION + 1, sizeof(StrataPluginDescriptor), "foreign", "0.0.1", STRATA_TORCH_VERSION_STRING,
      STRATA_CXX_ABI_TAG, &register_components
#elif FOREIGN_FIELD == 2
      STRATA_ABI_VERSION, sizeof(StrataPluginDescriptor), "foreign", "0.0.1", "1.13.0", STRATA_CXX_ABI_TAG,
      &register_components
#elif FOREIGN_FIELD == 3
      STRATA_ABI_VERSION, sizeof(StrataPluginDescriptor), "foreign", "0.0.1", STRATA_TORCH_VERSION_STRING,
      "libstdc++-pre-cxx11", &register_components
#elif FOREIGN_FIELD == 4
      STRATA_ABI_VERSION_MAJOR, sizeof(StrataPluginDescriptor), "foreign", "0.0.1", STRATA_TORCH_VERSION_STRING,
      STRATA_CXX_ABI_TAG, &register_components, STRATA_ABI_VERSION_MINOR + 1
#else
      STRATA_ABI_VERSION_MAJOR, offsetof(StrataPluginDescriptor, abi_minor), "older", "0.0.1", STRATA_TORCH_VERSION_STRING,
      STRATA_CXX_ABI_TAG, &register_components, 999  // beyond its struct_size: never read
#endif
  };
  return &descriptor;
}
