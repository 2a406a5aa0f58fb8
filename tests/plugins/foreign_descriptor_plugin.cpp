// A plugin whose descriptor disagrees with the host: built "for" another ABI major, a newer ABI
// minor, another libtorch or C++ ABI; or one from before 1.0, whose integer version may read as
// major 1 but whose descriptor ends before abi_minor (refused by its size). The build picks the
// case with FOREIGN_FIELD.
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
      1, offsetof(StrataPluginDescriptor, abi_minor), "before_1_0", "0.0.1", STRATA_TORCH_VERSION_STRING,
      STRATA_CXX_ABI_TAG, &register_components, 0  // beyond its struct_size: never read
#endif
  };
  return &descriptor;
}
