// Who started this process and as which rank: OpenMPI's mpirun, MPICH/PMI, Slurm's srun or
// torchrun, recognised from their environment variables.
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  // The device slot this rank runs on: local_rank, unless `strata run -n N` excluded slots its
  // health check found faulty and lists the ones in use in $STRATA_SLOTS ("0,2,3": rank 1 runs
  // on slot 2). A CUDA job takes device slot % device count.
  int slot = 0;
  std::string launcher = "none";  // "openmpi", "pmi", "slurm", "torchrun", "none"
  // The node (host) this rank runs on, whose memory holds its flash snapshots: SLURM_NODEID,
  // torchrun's GROUP_RANK, else rank / local_size (launchers fill nodes with contiguous ranks); under
  // `strata run -n N --simulate-nodes K` ($STRATA_SIMULATED_NODES = K) rank / (N / K): K nodes on
  // one machine, for tests and demos.
  int node = 0;
};

inline constexpr const char* kSlotsEnv = "STRATA_SLOTS";
inline constexpr const char* kSimulatedNodesEnv = "STRATA_SIMULATED_NODES";

STRATA_API LaunchEnv detect_launch_env();

// torchrun restarted this worker group (torchrun --max-restarts; TORCHELASTIC_RESTART_COUNT > 0):
// a Trainer then continues the run from its newest checkpoint, whatever the program asked, so
// `strata run` and programs on the library API alike survive a failed rank under torchrun.
STRATA_API bool restarted_by_torchelastic(const LaunchEnv& env);

// Sets torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK from `env`: the c10d
// backend's rendezvous reads torchrun's variables, and ranks started by srun or mpirun that use
// it (no MPI past start-up) are told their place in their own launcher's variables.
STRATA_API void export_torchrun_env(const LaunchEnv& env);

// The CUDA device a rank on device slot `slot` uses when the node lists `device_count` devices:
// slot % device_count, so the ranks of a node spread over its devices (cuda:LOCAL_RANK when
// there are as many devices as local ranks) instead of all taking cuda:0.
STRATA_API int cuda_device_for_slot(int slot, int device_count);

// Set by `strata run -n N` for its ranks to "1" or "0": whether the launcher's own standard
// output is a terminal. Ranks under mpirun write to mpirun's pipe or pseudo-terminal, so only the
// launcher knows whether progress bars (ANSI redraws) belong in the output.
inline constexpr const char* kStdoutIsTerminalEnv = "STRATA_STDOUT_IS_TERMINAL";
STRATA_API bool stdout_is_terminal();

}  // namespace strata
