// What a Trainer holds (strata/core/trainer.h), shared by the files that implement it:
// trainer.cpp (set-up, step, run, save) and resume.cpp (load).
#pragma once

#include <array>
#include <chrono>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "metrics.h"
#include "tensorboard.h"
#include "op_profile.h"
#include "sampler.h"
#include "schedule.h"
#include "snapshot_replicas.h"
#include "stage_figures.h"
#include "strata/core/flash_checkpoint.h"
#include "strata/core/launch_env.h"
#include "strata/core/progress.h"
#include "strata/core/run_directory.h"
#include "strata/core/trainer.h"
#include "strata/data.h"

namespace strata {

// One Trainer per process at a time, holding the process-wide operator table: the registry's
// implementations are installed for the Trainer's life and removed when it goes (also when its
// set-up fails), before the registry whose plugins own their code can go.
class ProcessTrainerSlot {
 public:
  explicit ProcessTrainerSlot(const ComponentRegistry& registry);
  ~ProcessTrainerSlot();
  ProcessTrainerSlot(const ProcessTrainerSlot&) = delete;
  ProcessTrainerSlot& operator=(const ProcessTrainerSlot&) = delete;
};

// Declared in the order they are built; destroyed in reverse, so the beacon outlives the
// communicators that record into it, the sampler its dataset, and the job's states the optimizer.
struct Trainer::Impl {
  ResolvedStrategy plan;
  std::vector<size_t> order;
  const ComponentRegistry& registry;
  ProcessTrainerSlot process_slot;
  RunOptions options;
  LaunchEnv env;
  std::filesystem::path out_dir, checkpoints_dir;
  bool leader = false;

  std::optional<ProgressBeacon> progress;  // where this rank is, for the supervisor's hang detection
  std::shared_ptr<Topology> topology;
  std::optional<RunDirectoryClaim> claim;
  c10::Device device{c10::kCPU};
  std::unique_ptr<Job> job;
  std::unique_ptr<TokenDataset> dataset;
  std::unique_ptr<engine::BatchSampler> sampler;
  std::unique_ptr<Optimizer> optimizer;  // built once passes are applied
  std::optional<engine::LrSchedule> schedule;
  std::optional<engine::Console> console;
  double peak_flops_all_devices_tflops = 0;  // MFU's denominator: one device's peak x the devices (device_peak.h)
  std::optional<engine::MetricsFile> metrics;  // rank 0's
  std::optional<engine::TensorBoardWriter> tensorboard;  // rank 0's, with [job] tensorboard
  // Flash checkpoints: under a supervisor that persists them (STRATA_FLASH_DIR), the ranks
  // snapshot into shared memory and never write to disk themselves; `flash_dir` is this rank's
  // node's store (flash_node_store).
  std::optional<FlashWriter> flash;
  std::string flash_dir;
  std::optional<engine::SnapshotReplicas> replicas;  // [job] snapshot_replicas > 0
  int flash_peer_node = -1;
  double replica_seconds = 0;  // of the last save, spent on replicas
  bool replica_post_due = false;      // the last save's snapshot is to be posted to the replicas
  double replica_post_seconds = 0;    // posting it took; counted with the next save  // the node whose replica this rank's state came from at the last restore, or -1
  bool snapshot_skipped = false;  // by some rank, at the last save

  // Checkpoints found at set-up (the newest one that passes its checksums, older ones to fall
  // back on, why newer ones were passed over), consumed by the first load().
  std::optional<engine::Checkpoint> newest;
  std::vector<std::filesystem::path> older;
  std::vector<std::string> skipped;
  bool checkpoints_found = false;
  // The state hashes a disk checkpoint of this run may carry (engine::accepted_state_hashes), read
  // before this run rewrites strategy.toml.
  std::set<std::string> accepted_hashes;

  int64_t steps = 0, global_batch = 0, seq_len = 0, micro_count = 0;
  int64_t step = 0;  // the last step done or restored
  int64_t first_step = 1;
  std::vector<at::Tensor> params;
  engine::OpProfile profile;
  int64_t profile_first = 0, profile_last = 0;  // [job] profile_steps after two warm-up steps
  StepRecord last;  // the newest step recorded

  // Steps run whose figures are not read yet (advance() says when they are).
  struct UnreadStep {
    StepRecord record;
    at::Tensor loss, grad_norm;  // where the step left them
    std::vector<std::pair<std::string, at::Tensor>> device_figures;  // StepProgram::report_device_figure's
    engine::StageFigures::Figures model_figures;  // with a pipeline: the model's, summed over the stages when read
    std::array<double, 5> memory{};  // this rank's engine::MemoryFigures, in their order
    double host_ms = 0;
    int64_t host_reads = 0;  // read_on_host calls during the step
    at::Tensor skip_flag;  // StepProgram::skip_flag() as this step left it (undefined: no pass can skip a step)
    bool skipped = false;  // a pass or hook skipped the update (known once read)
  };
  std::vector<UnreadStep> unread;
  std::optional<engine::StageFigures> stage_figures;  // with a pipeline (engine/stage_figures.h)
  std::chrono::steady_clock::time_point unread_since;  // when the first unread step started
  // Ranks no supervisor of ours started (torchrun, srun, mpirun): whether this rank was signalled
  // to stop (Trainer::run's stop_requested), asked of every rank at each read of the figures, and
  // whether any had been at the last one: then all stop after that same step.
  std::function<bool()> rank_signalled;
  bool any_rank_signalled = false;

  // Built in these steps, in this order (trainer.cpp).
  Impl(const ResolvedStrategy& plan, std::vector<size_t> order, const ComponentRegistry& registry, RunOptions options);
  void start_rank();
  void claim_run_directory();
  void configure_process();
  void build_job();
  void compose_step();
  void prepare_loop();
  void find_checkpoints();  // into newest/older/skipped
  // The flash snapshot every rank agrees is the newest whole one, restored into the job; its
  // step, or 0 with `problem` saying why not.
  int64_t restore_flash(std::string& problem);
  // From the step resumed at: the metrics kept, snapshots of later steps dropped, the profile
  // window placed.
  void continue_from(int64_t resumed_step);
  double save(int64_t step, bool to_disk);  // the seconds training was blocked
  double evaluate(int64_t step);
  const StepRecord& advance(bool read_figures);  // one step (trainer.cpp)
  void read_unread(bool across_ranks = true);
  void record_unread();
  void stop_if_diverged();
};

}  // namespace strata
