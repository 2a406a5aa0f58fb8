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

}  // namespace strata
