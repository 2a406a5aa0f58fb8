// Where this rank runs: its place in the [parallel] mesh with the communicators, and its device.
#include "topology_setup.h"

#include <ATen/Context.h>

#include "strata/core/cuda_runtime.h"
#include "strata/core/flight_recorder.h"
#include "strata/core/local_communicator.h"
#include "strata/errors.h"

namespace strata::engine {

c10::Device parse_device(const std::string& text, int local_rank) {
  try {
    c10::Device device(text);
    if (device.is_cuda() && !at::hasCUDA()) {
      const CudaRuntime& runtime = load_cuda_runtime();
      throw UserError("[job] device = \"" + text + "\" but no CUDA device is available" + (runtime.loaded ? "" : " (" + runtime.why + ")"));
    }
    if (device.is_cuda() && !device.has_index())
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_for_slot(local_rank, at::getNumGPUs())));
    return device;
  } catch (const c10::Error&) {
    throw UserError("[job] device \"" + text + "\" is not a device name (cpu, cuda, cuda:N)");
  }
}

std::shared_ptr<Topology> make_topology(const ResolvedStrategy& plan, const ComponentRegistry& registry, const LaunchEnv& env,
                                        ProgressBeacon& progress) {
  const ParallelLayout& l = plan.layout;
  if (l.world_size != env.world_size)
    throw UserError("the plan is for " + std::to_string(l.world_size) + " ranks but " + std::to_string(env.world_size) +
                    " were started (" + env.launcher + ")");
  std::vector<Dim> order;
  for (const auto& name : l.order)
    order.push_back(name == "tensor" ? Dim::Tensor : name == "context" ? Dim::Context : name == "pipeline" ? Dim::Pipeline : Dim::Data);
  auto topology = std::make_shared<Topology>(
      std::map<Dim, int>{{Dim::Data, static_cast<int>(l.mesh.data)}, {Dim::Tensor, static_cast<int>(l.mesh.tensor)},
                         {Dim::Pipeline, static_cast<int>(l.mesh.pipeline)}, {Dim::Context, static_cast<int>(l.mesh.context)},
                         {Dim::Expert, static_cast<int>(l.mesh.expert)}},
      order, env.rank);
  const std::string& name = plan.parallel.get_string("backend");
  auto backend_named = [&](const std::string& n) {
    const auto* b = static_cast<const CommunicatorBackend*>(registry.find(ComponentKind::Communicator, n));
    if (!b) throw UserError("[parallel] backend \"" + n + "\" is not a registered communicator (see `strata plugins`)");
    return b;
  };
  // One host rank needs no bootstrap; several meet through MPI (mpirun, srun) or through c10d's
  // store (torchrun and the launchers that set its environment), where c10d is the default.
  std::shared_ptr<Communicator> bootstrap = local_communicator();
  const bool torchrun = env.launcher == "torchrun";
  std::string bootstrap_name = name == "c10d" ? "c10d" : "mpi";
  if (env.world_size > 1 && torchrun) {
    if (name == "mpi" && plan.parallel.entry("backend").origin != Origin::Default)
      throw UserError("started by torchrun, but [parallel] backend = \"mpi\" needs mpirun or srun; use backend \"c10d\" (the "
                      "default under torchrun) or start the ranks with mpirun");
    bootstrap_name = "c10d";
  }
  // Ranks that srun or mpirun started may meet through c10d too (backend = "c10d": MPI only
  // starts them); its rendezvous reads torchrun's variables, so they get them from their own.
  if (env.world_size > 1 && bootstrap_name == "c10d" && !torchrun) export_torchrun_env(env);
  if (env.world_size > 1) bootstrap = backend_named(bootstrap_name)->world(*bootstrap);
  // A host-tensor job on one rank keeps the local communicator; device backends always start.
  auto world = name == "mpi" || name == "c10d" ? bootstrap : backend_named(name)->world(*bootstrap);
  // Under a supervisor every operation goes to the flight recorder (strata/core/flight_recorder.h).
  topology->attach(record_collectives(std::move(world), progress));
  const std::vector<std::pair<Dim, const char*>> dims{{Dim::Data, "data"}, {Dim::Tensor, "tensor"}, {Dim::Pipeline, "pipeline"}, {Dim::Context, "context"}};
  for (unsigned mask = 1; mask < 16; ++mask) {  // name every group by the dimensions it spans
    std::vector<Dim> spanned;
    std::string label;
    bool every_dim_split = true;  // else the group is the same as a smaller mask's
    for (unsigned d = 0; d < dims.size(); ++d) {
      if (!(mask & (1u << d))) continue;
      spanned.push_back(dims[d].first);
      label += label.empty() ? dims[d].second : std::string("+") + dims[d].second;
      every_dim_split = every_dim_split && topology->size(dims[d].first) > 1;
    }
    if (every_dim_split && topology->size(spanned) < topology->world_size()) label_group(topology->group(spanned), label);
  }
  return topology;
}

}  // namespace strata::engine
