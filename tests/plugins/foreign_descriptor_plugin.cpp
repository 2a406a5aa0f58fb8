// A plugin whose descriptor disagrees with the host: built "for" another ABI version, libtorch
// or C++ ABI. The build picks the disagreement with FOREIGN_FIELD.
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
#else
      STRATA_ABI_VERSION, sizeof(StrataPluginDescriptor), "foreign", "0.0.1", STRATA_TORCH_VERSION_STRING,
      "libstdc++-pre-cxx11", &register_components
#endif
  };
  return &descriptor;
}
