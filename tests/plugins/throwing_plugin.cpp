// Registers one component, then fails: the registry must keep none of it.
#include <stdexcept>

#include "strata/plugin.h"

namespace {
void register_components(strata::Registry& registry) {
  registry.add(std::make_unique<strata::Component>(
      strata::ComponentInfo{strata::ComponentKind::Communicator, "half_registered", "Never visible", {}}));
  throw std::runtime_error("boom while registering");
}
}  // namespace

STRATA_PLUGIN("throwing", "0.0.1", register_components)
