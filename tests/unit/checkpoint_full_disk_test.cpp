// A file system that refuses a write (a full disk, a file-size limit): write_safetensors says the
// system's reason and leaves no partial file, and a checkpoint save says one line that names the
// checkpoint rather than a rank's file (so that the supervisor prints it once for every rank)
// while the checkpoints saved before stay loadable.
#include <csignal>
#include <filesystem>

#include <sys/resource.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../../core/src/checkpoint/checkpoint.h"
#include "strata/core/local_communicator.h"
#include "strata/core/safetensors.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

TEST(FullDisk, WriteSafetensorsSaysWhyAndLeavesNoPartialFile) {
  const fs::path dir = fs::temp_directory_path() / "strata_full_disk_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The temporary file the writer opens is /dev/full, where every write fails with ENOSPC.
  fs::create_symlink("/dev/full", dir / "model.safetensors.tmp");
  try {
    write_safetensors(dir / "model.safetensors", {{"w", at::ones({1024, 64})}});
    ADD_FAILURE() << "a write to /dev/full succeeded";
  } catch (const FileWriteError& e) {
    EXPECT_EQ(e.reason, "No space left on device");
    EXPECT_EQ(e.path, dir / "model.safetensors.tmp");
    EXPECT_EQ(std::string(e.what()), "cannot write " + (dir / "model.safetensors.tmp").string() + ": No space left on device");
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "model.safetensors.tmp")));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  fs::remove_all(dir);
}

TEST(FullDisk, CheckpointSaveNamesTheCheckpointAndKeepsTheOneBefore) {
  const fs::path dir = fs::temp_directory_path() / "strata_full_disk_checkpoints";
  fs::remove_all(dir);
  auto world = local_communicator();
  engine::save_checkpoint(dir, {1, "hash", 1}, {{"w", at::ones({8})}}, {}, 3, *world, at::kCPU);
  // A file-size limit below the next checkpoint's file: its write fails with EFBIG (the signal
  // the kernel sends with it ignored), as a full disk's fails with ENOSPC.
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = before;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    engine::save_checkpoint(dir, {2, "hash", 1}, {{"w", at::ones({1 << 16})}}, {}, 3, *world, at::kCPU);
  } catch (const UserError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(message, "cannot save the checkpoint of step 2 in " + dir.string() + ": File too large; the newest saved before, step_00000001, is intact");
  EXPECT_FALSE(fs::exists(dir / ".tmp-step_00000002" / "rank_00000.safetensors.tmp"));
  EXPECT_FALSE(fs::exists(dir / "step_00000002"));
  const engine::Checkpoint kept = engine::Checkpoint::open(dir / "step_00000001");
  EXPECT_EQ(kept.meta().step, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
