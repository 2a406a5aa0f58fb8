// The mpi communicator backend: OpenMPI, host tensors.
#include "mpi_communicator.h"
#include "strata/plugin.h"

namespace strata::comm_mpi {
namespace {

class MpiBackend final : public CommunicatorBackend {
 public:
  MpiBackend() : CommunicatorBackend({ComponentKind::Communicator, "mpi", "OpenMPI collectives on host tensors, run on a dedicated thread", {}}) {}
  std::shared_ptr<Communicator> world(Communicator&) const override { return mpi_world(); }
};

void register_components(Registry& registry) { registry.add(std::make_unique<MpiBackend>()); }

}  // namespace
}  // namespace strata::comm_mpi

STRATA_PLUGIN("comm_mpi", "0.1.0", strata::comm_mpi::register_components)
