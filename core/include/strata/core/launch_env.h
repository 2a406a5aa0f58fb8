// Who started this process and as which rank: OpenMPI's mpirun, MPICH/PMI, Slurm's srun or
// torchrun, recognised from their environment variables.
#pragma once

#include <string>

#include "strata/export.h"

namespace strata {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  std::string launcher = "none";  // "openmpi", "pmi", "slurm", "torchrun", "none"
};

STRATA_API LaunchEnv detect_launch_env();

// Set by `strata run -n N` for its ranks to "1" or "0": whether the launcher's own standard
// output is a terminal. Ranks under mpirun write to mpirun's pipe or pseudo-terminal, so only the
// launcher knows whether progress bars (ANSI redraws) belong in the output.
inline constexpr const char* kStdoutIsTerminalEnv = "STRATA_STDOUT_IS_TERMINAL";
STRATA_API bool stdout_is_terminal();

}  // namespace strata
