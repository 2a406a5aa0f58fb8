// Which rank and device a process is, from its launcher's environment (strata/core/launch_env.h).
#include <cstdlib>

#include <gtest/gtest.h>

#include "strata/core/launch_env.h"

namespace strata {
namespace {

// Sets torchrun's variables for the test's lifetime, with MPI's and Slurm's out of the way.
class TorchrunEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                             "SLURM_NODEID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", kSlotsEnv,
                             "GROUP_RANK", kSimulatedNodesEnv})
      ::unsetenv(name);
    ::setenv("RANK", "1", 1), ::setenv("WORLD_SIZE", "2", 1), ::setenv("LOCAL_RANK", "1", 1), ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  }
  void TearDown() override {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", kSlotsEnv}) ::unsetenv(name);
  }
};

TEST_F(TorchrunEnvironment, LocalRankOneOnTwoDevicesAsksForCudaOne) {
  const LaunchEnv env = detect_launch_env();
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(cuda_device_for_slot(env.slot, /*device_count=*/2), 1);
  // More local ranks than devices share them round robin; no listing at all is device 0.
  EXPECT_EQ(cuda_device_for_slot(3, 2), 1);
  EXPECT_EQ(cuda_device_for_slot(1, 0), 0);
}

TEST_F(TorchrunEnvironment, SlotsExcludedByTheHealthCheckAreSkipped) {
  ::setenv(kSlotsEnv, "0,2", 1);  // slot 1 failed its check: local rank 1 runs on slot 2
  EXPECT_EQ(cuda_device_for_slot(detect_launch_env().slot, 4), 2);
}

// srun's ranks using the c10d backend are told torchrun's variables from Slurm's.
TEST_F(TorchrunEnvironment, SlurmRanksGetTorchrunsVariablesForC10d) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) ::unsetenv(name);
  ::setenv("SLURM_PROCID", "5", 1), ::setenv("SLURM_NTASKS", "8", 1), ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_NTASKS_PER_NODE", "4", 1);
  const LaunchEnv env = detect_launch_env();
  EXPECT_EQ(env.launcher, "slurm");
  export_torchrun_env(env);
  for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}) ::unsetenv(name);
  EXPECT_STREQ(std::getenv("RANK"), "5");
  EXPECT_STREQ(std::getenv("WORLD_SIZE"), "8");
  EXPECT_STREQ(std::getenv("LOCAL_RANK"), "1");
  EXPECT_STREQ(std::getenv("LOCAL_WORLD_SIZE"), "4");
  const LaunchEnv same = detect_launch_env();  // read back as torchrun's
  EXPECT_EQ(same.rank, 5);
  EXPECT_EQ(same.world_size, 8);
  EXPECT_EQ(same.local_rank, 1);
  EXPECT_EQ(same.local_size, 4);
}

// srun gives the step's tasks per node as "2(x3),1" (SLURM_NTASKS_PER_NODE only when asked for).
TEST_F(TorchrunEnvironment, SlurmLocalSizeIsThisNodesTaskCount) {
  ::setenv("SLURM_PROCID", "6", 1), ::setenv("SLURM_NTASKS", "7", 1), ::setenv("SLURM_LOCALID", "0", 1);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1", 1);
  ::setenv("SLURM_NODEID", "3", 1);
  EXPECT_EQ(detect_launch_env().local_size, 1);
  ::setenv("SLURM_NODEID", "1", 1);
  EXPECT_EQ(detect_launch_env().local_size, 2);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "garbled", 1);  // not Slurm's form: the whole world, as before
  EXPECT_EQ(detect_launch_env().local_size, 7);
  for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"}) ::unsetenv(name);
}

// The node a rank's flash snapshots live on: Slurm's node id, torchrun's GROUP_RANK, or with
// `strata run --simulate-nodes K` contiguous blocks of N / K ranks (a shrunk world keeps K nodes).
TEST_F(TorchrunEnvironment, NodeComesFromTheLauncherOrTheSimulation) {
  ::setenv("RANK", "5", 1), ::setenv("WORLD_SIZE", "8", 1), ::setenv("LOCAL_WORLD_SIZE", "4", 1), ::setenv("GROUP_RANK", "1", 1);
  EXPECT_EQ(detect_launch_env().node, 1);
  ::unsetenv("GROUP_RANK");
  EXPECT_EQ(detect_launch_env().node, 1);  // 5 / 4
  ::setenv(kSimulatedNodesEnv, "4", 1);
  EXPECT_EQ(detect_launch_env().node, 2);  // ranks 4 and 5 are node 2 of 4
  ::setenv("WORLD_SIZE", "7", 1);  // 8 ranks on 4 nodes shrunk to 7: nodes of 2, the last of 1
  EXPECT_EQ(detect_launch_env().node, 2);
  ::setenv("RANK", "6", 1);
  EXPECT_EQ(detect_launch_env().node, 3);
  ::unsetenv(kSimulatedNodesEnv);
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}) ::unsetenv(name);
  ::setenv("SLURM_PROCID", "6", 1), ::setenv("SLURM_NTASKS", "7", 1), ::setenv("SLURM_NODEID", "3", 1);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1", 1);
  EXPECT_EQ(detect_launch_env().node, 3);
  for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"}) ::unsetenv(name);
}

}  // namespace
}  // namespace strata
