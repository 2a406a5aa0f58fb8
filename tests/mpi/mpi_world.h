// The mpi communicator over all ranks of an mpirun job, loaded from the bundled plugin once per
// test process.
#pragma once

#include <memory>

#include "strata/comm.h"
#include "strata/core/local_communicator.h"
#include "strata/core/plugin_loader.h"

namespace strata::testing {

inline std::shared_ptr<Communicator> mpi_world() {
  static std::shared_ptr<Communicator> instance = [] {
    static ComponentRegistry registry;
    PluginLoader(registry).load_search_path({installed_plugin_dir()});
    auto* backend = static_cast<const CommunicatorBackend*>(registry.find(ComponentKind::Communicator, "mpi"));
    return backend->world(*local_communicator());  // mpi needs no bootstrap
  }();
  return instance;
}

}  // namespace strata::testing
