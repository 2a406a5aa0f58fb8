// The mpi communicator backend: OpenMPI, host tensors.
#include "mpi_communicator.h"
#include "strata/plugin.h"

namespace strata::comm_mpi {
namespace {

class MpiBackend final : public CommunicatorBackend {
 public:
  MpiBackend() : CommunicatorBackend({ComponentKind::Communicator, "mpi", "OpenMPI collectives on host tensors, run on a dedicated thread", {}}) {}
  // Held for the backend's lifetime: MPI cannot be initialised again once finalised (when the
  // world's thread ends), and a program may build one trainer after another (Strategy::automatic
  // measures candidates with trainers of their own before the one that trains).
  std::shared_ptr<Communicator> world(Communicator&) const override {
    if (!world_) world_ = mpi_world();
    return world_;
  }

 private:
  mutable std::shared_ptr<Communicator> world_;
};

void register_components(Registry& registry) { registry.add(std::make_unique<MpiBackend>()); }

}  // namespace
}  // namespace strata::comm_mpi

STRATA_PLUGIN("comm_mpi", "0.1.0", strata::comm_mpi::register_components)
