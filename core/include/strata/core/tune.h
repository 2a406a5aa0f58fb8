// `strata tune`: the candidate strategies for N ranks, generated from what the loaded passes
// declare, checked by the same validation `strata plan` runs, and ranked by an analytic cost
// model (strata/cost.h) before any of them is measured.
//
// The search space is never a list written here. Its axes are
//  * the mesh: every factorisation of N over the dimensions some loaded pass claims (a size the
//    strategy fixes stays fixed);
//  * for each dimension sized above one, which of the passes claiming it serves it (data: ddp,
//    zero1, zero2, fsdp, or a plugin's) unless the strategy already names one;
//  * every pass that declares TuneUse::Try and that the strategy does not name, on and off;
//  * every key some enabled pass or [job] declares with tune values (KeySpec::tune_values) and
//    the strategy leaves unset.
// What the strategy states is never changed. A candidate whose plan fails validation is kept
// with the first reason, so `strata tune` can say why it was dropped.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"
#include "strata/cost.h"

namespace strata {

// The cost model: core's single-process figures for the data rank's share (core_estimate: it
// weighs the model's shape and the optimizer's state, the costly part), then every enabled pass's
// Pass::estimate in pass order (add_pass_estimates; tune applies it to variants of one plan).
STRATA_API CostEstimate core_estimate(const ResolvedStrategy& plan);
STRATA_API CostEstimate add_pass_estimates(const ResolvedStrategy& plan, const std::vector<size_t>& order, CostEstimate core);

// What the predictions divide by and add, per rank: matmul FLOP/s as ranks run concurrently,
// collective bytes per second, the fixed cost of running one layer's forward and backward on one
// micro-batch (operator dispatch: what makes many small micro-batches slower than few large ones
// at equal FLOPs), the cost per parameter and micro-batch of streaming weights and gradients
// through the GEMMs (what makes splitting tokens cheaper in FLOPs than in time), and the memory a
// rank's process holds before its model (libtorch, plugins). `strata tune` measures them
// (measure_rates); the defaults are for ranking without measuring.
struct HardwareRates {
  double flops_per_s = 1e10;       // one rank alone on a core
  double oversubscription = 1;     // ranks per core when there are more ranks than cores (CPU runs)
  double bytes_per_s = 1e9;        // collective bus bandwidth (`strata doctor`)
  double message_latency_s = 0;    // one small collective's time (`strata doctor`)
  double layer_overhead_s = 1e-4;
  double parameter_pass_s = 0;     // per parameter a rank computes with, per micro-batch
  double process_bytes = 0;
};
// This machine's rates as `ranks` ranks see them: matmul, parameter pass and layer overhead on one
// thread here, the collectives by `strata_executable doctor -n ranks` (tune/hardware_rates.cpp).
STRATA_API HardwareRates measure_rates(int64_t ranks, const std::filesystem::path& strata_executable);
// Seconds per optimizer step: compute stretched by the pipeline bubble, or, when ranks share
// cores, by the sharing (a rank idle in a bubble leaves its core to the others, so the larger of
// the two counts); plus communication, bytes over bandwidth and messages times latency (not
// overlapped: a conservative bound that ranks layouts the way their traffic does); plus the
// per-layer, per-micro-batch overhead and the parameter pass (the parameters a rank computes with,
// the model's over tensor x pipeline, once per micro-batch), both stretched by core sharing.
STRATA_API double predicted_step_seconds(const CostEstimate& cost, const HardwareRates& rates);
// Bytes a rank holds at its peak: the model's and the passes' figures plus the process's own.
STRATA_API double predicted_peak_bytes(const CostEstimate& cost, const HardwareRates& rates);

struct TuneCandidate {
  RawStrategy raw;                  // the strategy with tune's choices written in
  std::vector<std::string> choices; // what tune chose, "parallel.tensor = 2", "pass fsdp", "pass.fsdp.x = y"
  std::string layout;               // "data 2 (fsdp) x tensor 2 (tensor_parallel)"
  std::string rejected;             // why its plan failed; empty when it planned
  CheckedPlan checked;              // when it planned
  CostEstimate cost;
  double predicted_s = 0;
  double predicted_bytes = 0;  // per rank, at the peak
};

// --finetune (ATorch's finetune_strategy): `raw` must plan as it is on `ranks`; its mesh sizes are
// fixed as planned, its layout and passes stay, and the values it gives searched keys
// (KeySpec::tune_values) are removed so the search tries every declared value of them (passes that
// declare TuneUse::Try are tried on and off as always). The strategy itself is one of the
// candidates when its values are among the declared ones. False, with the problems, when it does
// not plan.
STRATA_API bool open_to_finetune(RawStrategy& raw, const ComponentRegistry& registry, int64_t ranks, Diagnostics& diagnostics);

// The choices of a candidate other than its layout (which `layout` says), "; " between them, or
// empty: "pass.tensor_parallel.sequence_parallel = false; job.micro_batch = 2".
STRATA_API std::string other_choices(const TuneCandidate& candidate);

struct TuneSpace {
  std::vector<TuneCandidate> candidates;  // planned first, by predicted time (then memory); then the rejected
  size_t generated = 0;
  size_t duplicates = 0;   // planned the same as an earlier candidate (micro_batch 0 and its size), dropped
  bool truncated = false;  // more than `limit` combinations: the rest were not generated
};

// Every candidate for `world_size` ranks around `base` (the user's strategy, plugins loaded in
// `registry`), planned and predicted. `limit` caps the combinations generated.
STRATA_API TuneSpace generate_candidates(const RawStrategy& base, const ComponentRegistry& registry, int64_t world_size,
                                         const HardwareRates& rates, size_t limit = 20000);

}  // namespace strata
