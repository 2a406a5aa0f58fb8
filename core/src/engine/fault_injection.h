// Chaos testing (tests/cli/chaos_test.sh, flash_chaos_test.sh): faults injected into a training
// rank at named points of the step, as STRATA_FAULT asks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace strata::engine {

// STRATA_FAULT holds faults separated by ';', each "KIND RANK STEP [@ATTEMPT]", applied in the
// first attempt of a supervised run only (STRATA_RESTART_COUNT, or under torchrun
// TORCHELASTIC_RESTART_COUNT, 0) so that the restarted ranks run clean, or in every attempt with
// STRATA_FAULT_EVERY_ATTEMPT set (to test giving up), or with "@K" in attempt K alone (a chain of
// failures in one run: bench/node_chaos.py). At `point`:
//   "step"     (as step STEP starts; STEP 0: at start-up) kill: SIGKILL, stop: SIGSTOP;
//              lose_node (its RANK field is a node, LaunchEnv::node): every rank of that node
//              deletes the node's flash snapshot store and kills itself, as a host that dies;
//   "backward" (as the backward of step STEP's first micro-batch starts) stop_in_backward: SIGSTOP;
//   "snapshot" (halfway through the flash copy of step STEP) kill_in_snapshot: SIGKILL;
//   "snapshot_done" (after the flash snapshot of step STEP) corrupt_snapshot: returns true, and
//              the caller flips a byte of that snapshot;
//   "replica"  (once the snapshot of step STEP is posted to its replicas, its bytes in flight)
//              kill_in_replica: SIGKILL; lose_node_in_replica (RANK is a node): as lose_node;
//   "evaluation" (as the evaluation of step STEP reads each validation batch) slow_evaluation, and
//   "checkpoint" (after each piece of step STEP's disk checkpoint is written) slow_checkpoint, and
//   "restore"  (STEP 0: after each 4 MiB hashed and each tensor read of a disk checkpoint a
//              resuming rank restores) slow_restore: sleeps 200 ms, making a long phase that beats
//              (the hang watch must wait it out);
//   "export"   (strata ckpt export, RANK 0 STEP 0: after each weight file of a split export is
//              staged) kill_in_export: SIGKILL.
// `before_kill` runs before a "step" kill.
bool inject_fault(int rank, int64_t step, const std::string& point = "step", const std::function<void()>& before_kill = {});

}  // namespace strata::engine
