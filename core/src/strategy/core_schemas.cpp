// The keys core itself reads. Components declare the keys of [model], [data], [optimizer]
// (beyond these common ones) and of each [[pass]].
#include "strata/core/strategy.h"

namespace strata {

const Schema& job_schema() {
  static const Schema schema = Schema()
      .required_string("model", "Registered model factory to train (see `strata plugins`); may be left out when [model] init_from has a "
                                "config.json: the model that loads its model_type (`strata plugins` lists each model's)")
      .required_string("dataset", "Registered dataset; [data] holds its keys; may be left out when [data] path says: tokens for a directory "
                                  "`strata data prepare` wrote, a .bin file or a directory of train.bin and val.bin; text for a .txt file "
                                  "or a directory of .txt files")
      .integer("steps", 100, "Optimizer steps to train", between(1, 1e12))
      .integer("global_batch", 8, "Sequences per optimizer step across all data-parallel ranks (strong scaling)", between(1, 1 << 24))
      .integer("micro_batch", 0, "Sequences per rank per forward/backward; 0 = global_batch / data-parallel size (no accumulation)", between(0, 1 << 24))
      .tuned({int64_t{0}, int64_t{1}, int64_t{2}, int64_t{4}})
      .integer("seed", 1234, "Seed for initialisation, data order and dropout", at_least(0))
      .boolean("shuffle", true, "Shuffle training windows each epoch (deterministically from seed)")
      .integer("eval_batches", 8, "Micro-batches of the validation split each evaluation averages", at_least(1))
      .integer("keep_checkpoints", 3, "Newest checkpoints kept; older ones are deleted", at_least(1))
      .integer("threads", 0, "CPU threads for intra-op parallelism; 0 = all cores", at_least(0))
      .string("host_memory", "cache",
              "What the process does with host memory tensors free: \"cache\" has freed tensor blocks of 128 KiB and more wait "
              "for the next tensor of their exact size, each step giving back what the step before did not take, and glibc's "
              "malloc keep the rest (as \"keep\"); \"keep\" holds it all in glibc's heap (malloc told not to map and unmap "
              "blocks below 1 GiB nor trim its heap below 1 GiB: fewer page faults each step, a higher resident peak); "
              "\"return\" leaves glibc's defaults (large blocks go back to the system at once, faulted in again each step). "
              "fsdp 4 of a 201 M GPT: 4.3 s a step and 1058 MiB resident with cache, 4.5 s and 2094 MiB with keep, 8.1 s and "
              "1012 MiB with return (bench/results/host_memory_cpu.md)",
              {"keep", "return", "cache"})
      .real("peak_tflops", 0.0, "Peak TFLOP/s of one device for MFU; 0 = a GPU's from its name where known (H100, H200, A100, L40S, L4, V100), else not reported", at_least(0))
      .boolean("tensorboard", false, "Rank 0 writes TensorBoard event files under RUN_DIR/tensorboard: loss, val_loss, lr, grad_norm, tokens/s, step time, memory, MFU (where a peak is known)")
      .integer("log_every", 10, "Optimizer steps between console metric lines", at_least(1))
      .integer("profile_steps", 0,
               "Steps timed per operator after 2 warm-up steps: each rank writes profile_rank<R>.md into the run directory "
               "(ATen operators and autograd nodes by self time, as torch.profiler's self CPU); 0 = off",
               at_least(0))
      .integer("eval_every", 0, "Optimizer steps between evaluations; 0 = never", at_least(0))
      .integer("checkpoint_every", 0, "Optimizer steps between checkpoints; 0 = only at the end", at_least(0))
      .string("nonfinite", "stop",
              "A step whose loss or gradient norm is not finite and that no pass skipped (amp skips fp16 overflows): stop "
              "ends the run there, exit 2, before that step's evaluation and checkpoint; continue trains on with the "
              "non-finite weights",
              {"stop", "continue"})
      .boolean("checkpoint_at_end", true,
               "Write a checkpoint after the last step (with flash_every, the supervisor persists the last snapshot); false "
               "writes none at the end, for benchmarks and tuning trials (with checkpoint_every = 0 the run writes none at all)")
      .integer("flash_every", 0,
               "Optimizer steps between flash checkpoints under `strata run -n N`: each rank copies its state into shared "
               "memory (training blocks for the copy only) and the supervisor writes every checkpoint_every-th snapshot, "
               "and the newest at a failure or the end, to disk in the background; a restart loads from memory. "
               "0 = off (the ranks write checkpoints to disk themselves)",
               at_least(0))
      .integer("snapshot_replicas", 0,
               "Other nodes whose shared memory also holds each flash snapshot of a node (a ring: node k's go to nodes "
               "k+1 .. k+R), sent over the communicator while the next steps run; a restart after losing a node takes its "
               "ranks' state from a peer's replica instead of disk. Needs flash_every > 0 and R + 1 nodes "
               "(`strata run --simulate-nodes K` on one machine); 0 = off",
               between(0, 64))
      .integer("max_restarts", 0,
               "Times `strata run -n N` restarts all ranks from the newest checkpoint after a rank fails (killed, crashed, "
               "non-zero exit); bad input (exit 2) and Ctrl-C are never restarted",
               between(0, 1000))
      .real("hang_timeout", 0.0,
            "Seconds without progress on any rank before `strata run -n N` declares a hang, names the ranks behind, and "
            "restarts; 0 = the larger of 60 s and 10 x the slowest step, and start_timeout until the first step has ended",
            between(0, 1e6))
      .real("start_timeout", 600.0,
            "Seconds `strata run -n N` waits for every rank to report its first progress before declaring a hang at "
            "start-up and naming the ranks that never reported (with hang_timeout = 0, also the deadline of the first step)",
            between(1, 1e6))
      .integer("rank_memory_limit_mb", 0,
               "Caps the memory each rank may allocate after start-up at this many MiB (the operating system's data "
               "limit, RLIMIT_DATA, set to the rank's footprint at start plus this): an allocation past it fails, and a "
               "model or step that does not fit stops with a clear message instead of the machine swapping. 0 = no cap",
               at_least(0))
      .integer("min_ranks", 0,
               "Elastic world size under `strata run -n N`: when the same rank fails in two attempts in a row, continue "
               "on one rank fewer while at least min_ranks remain (0 = never shrink)",
               at_least(0))
      .string("health_check", "off",
              "Run `strata doctor` on the ranks before every start of `strata run -n N`: \"report\" prints and records "
              "each rank's figures and verdict; \"exclude\" also leaves faulty ranks out of the start (as min_ranks allows); "
              "\"exclude_stragglers\" leaves out stragglers too",
              {"off", "report", "exclude", "exclude_stragglers"})
      .real("restart_backoff", 1.0, "Seconds before the first restart, doubling with each further one (capped at 60)", between(0, 3600))
      .string("run_dir", "runs/default", "Directory for metrics, logs and checkpoints (strata run --out overrides)")
      .string("device", "cpu", "Device to train on: cpu, cuda or cuda:N")
      .strings("plugin_path", {}, "Extra plugin directories or files, relative to this strategy file");
  return schema;
}

const Schema& parallel_schema() {
  static const Schema schema = Schema()
      .integer_or_auto("data", "Data-parallel size; \"auto\" fills the world size", at_least(1))
      .integer("tensor", 1, "Tensor-parallel size", at_least(1))
      .integer("pipeline", 1, "Pipeline-parallel size (stages)", at_least(1))
      .integer("context", 1, "Context (sequence) parallel size", at_least(1))
      .integer("expert", 1, "Expert-parallel size: a factor of data, not of the world; each group of this many data ranks splits every mixture-of-experts layer's experts",
               at_least(1))
      .strings("order", {"tensor", "context", "pipeline", "data"},
               "Rank layout of the dimensions, innermost (adjacent ranks) first",
               {"tensor", "context", "pipeline", "data"})
      .string("backend", "mpi", "Communicator backend for multi-rank runs (see `strata plugins`)");
  return schema;
}

const Schema& optimizer_common_schema() {
  static const Schema schema = Schema()
      .string("name", "adamw", "Registered optimizer; its own keys follow in this section")
      .real("lr", 3e-4, "Peak learning rate", at_least(0))
      .string("schedule", "cosine",
              "Learning-rate schedule after warmup: cosine or linear decay to min_lr_ratio * lr at the last step, constant, or "
              "wsd (warmup-stable-decay: lr until the last decay_fraction of the steps, then decay_shape down to min_lr_ratio * lr)",
              {"cosine", "linear", "constant", "wsd"})
      .integer("warmup_steps", 0, "Linear warmup steps from 0 to lr", at_least(0))
      .real("min_lr_ratio", 0.1, "Final learning rate as a fraction of lr (cosine, linear and wsd)", between(0, 1))
      .real("decay_fraction", 0.2, "schedule = \"wsd\": the fraction of all steps that decay, at the end (never the warmup's)", between(0, 1))
      .string("decay_shape", "linear",
              "schedule = \"wsd\": the decay's shape: linear (1 - p), sqrt (1 - sqrt(p), Hägele et al. 2024's cooldown) or cosine, "
              "p the fraction of the decay done",
              {"linear", "sqrt", "cosine"})
      .real("grad_clip", 1.0, "Clip the global gradient norm to this; 0 = no clipping", at_least(0))
      .real("weight_decay", 0.0, "Weight decay of the decayed group (AdamW: decoupled; SGD: L2)", at_least(0))
      .boolean("decay_norms_and_biases", false, "Also decay norms, biases and embeddings (by default only Linear weights decay)");
  return schema;
}

const Schema& pass_common_schema() {
  static const Schema schema = Schema()
      .required_string("name", "Registered pass to apply")
      .boolean("enabled", true, "Switch the pass off without removing it (same as --disable NAME)");
  return schema;
}

}  // namespace strata
