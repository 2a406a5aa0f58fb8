#!/usr/bin/env bash
# tune_test.sh STRATA: `strata tune --dry-run` on 4 ranks (and 3) around the single-process
# example: candidates plan, what the strategy fixes stays fixed, a memory budget a model does not
# fit in drives the choice to a sharded layout, and a generous one does not.
set -u
strata=$1
# Its own cache: the rates measured by the first search answer the rest (docs/tune.md).
export XDG_CACHE_HOME=$(mktemp -d)
trap 'rm -rf "$XDG_CACHE_HOME"' EXIT
base=examples/strategies/single_process.toml
fail=0
check() { echo "tune_test: $1" >&2; fail=1; }
# The rows of the ranked table: "rank predicted-s peak-MiB layout ... other choices".
rows() { awk '/^ rank  predicted s/ {on = 1; next} on && /^ +[0-9]+ / {print} on && !/^ +[0-9]+ / {on = 0}' ; }

out=$("$strata" tune $base -n 4 --dry-run --top 1000) || check "plain search failed: $out"
[ "$(rows <<<"$out" | wc -l)" -ge 20 ] || check "fewer than 20 ranked candidates on 4 ranks: $out"
grep -q "data 4 (ddp)" <<<"$out" && grep -q "data 4 (fsdp)" <<<"$out" && grep -q "pipeline 4 (pipeline_parallel)" <<<"$out" \
  && grep -q "tensor 2 (tensor_parallel)" <<<"$out" && grep -q "pass act_checkpoint" <<<"$out" \
  || check "the search misses a data, pipeline, tensor or act_checkpoint candidate"
grep -q "n_head 2 does not divide by \[parallel\] tensor = 4" <<<"$out" || check "tensor 4 was not refused with the plan's reason"

out=$("$strata" tune $base -n 3 --dry-run --top 1000 --set job.global_batch=6) || check "3 ranks failed: $out"
rows <<<"$out" | grep -q "data 3 (zero1)" || check "no data 3 candidate on 3 ranks"

# Fixed by the strategy: every candidate keeps tensor 2, and keeps a pass the strategy names.
out=$("$strata" tune $base -n 4 --dry-run --top 1000 --set parallel.tensor=2) || check "fixed tensor failed: $out"
rows <<<"$out" | grep -v "tensor 2 (tensor_parallel)" | grep . && check "a candidate dropped the fixed tensor = 2"
[ "$(rows <<<"$out" | wc -l)" -ge 5 ] || check "too few candidates with tensor = 2: $out"

# A pass the strategy names switched off stays off: tests/cli/wsam.toml lists tensor, context and
# pipeline parallel disabled, so no candidate uses those dimensions (none is refused for naming a
# pass twice), and its enabled ddp serves data.
out=$("$strata" tune tests/cli/wsam.toml -n 2 --dry-run --top 1000) || check "the search around wsam.toml failed: $out"
grep -q "appears twice" <<<"$out" && check "candidates named a switched-off pass a second time: $out"
rows <<<"$out" | grep -E "tensor|pipeline|context" && check "a candidate used a dimension whose only pass is switched off"
rows <<<"$out" | grep -q "data 2 (ddp)" || check "no data 2 (ddp) candidate around wsam.toml: $out"

# WSAM runs the gradients twice a step, and the prediction says so. How much more depends on the
# rates this machine measured (the parameter pass and the layer overhead are not doubled): 1.7x
# with rates measured alone, 1.4x with rates measured beside other tests; before, 1.0x.
with=$(rows <<<"$out" | grep "data 2 (ddp) *job.micro_batch = 0$" | awk '{print $2}')
without=$("$strata" tune tests/cli/wsam.toml -n 2 --dry-run --disable wsam | rows | grep "data 2 (ddp) *job.micro_batch = 0$" | awk '{print $2}')
awk -v a="$with" -v b="$without" 'BEGIN {exit !(a >= 1.1 * b)}' || check "WSAM's step is not predicted above the base's: $with s against $without s"

# ... and holds a copy of the weights and the first gradient through the second pass: a GPT of
# 25M parameters (97 MiB of fp32 weights) is predicted 290 MiB above the base (measured: 361).
wide="--set model.n_layer=8 --set model.d_model=512 --set model.n_head=8"
with=$("$strata" tune tests/cli/wsam.toml -n 2 --dry-run $wide | rows | grep "data 2 (ddp) *job.micro_batch = 0$" | awk '{print $3}')
without=$("$strata" tune tests/cli/wsam.toml -n 2 --dry-run $wide --disable wsam | rows | grep "data 2 (ddp) *job.micro_batch = 0$" | awk '{print $3}')
awk -v a="$with" -v b="$without" 'BEGIN {exit !(a >= b + 250)}' || check "WSAM's memory is not predicted: $with MiB against $without MiB"

# A fixed expert size: only data sizes it divides are tried (the rest could not plan).
out=$("$strata" tune examples/strategies/mixtral.toml -n 4 --dry-run --top 1000) || check "the search around mixtral.toml failed: $out"
grep -q "does not divide the data size" <<<"$out" && check "candidates with a data size the expert size does not divide: $out"
rows <<<"$out" | grep -q "data 2" || check "no data 2 candidate around mixtral.toml: $out"

# A 300M-parameter model (3.6 GB of model states at 12 bytes per parameter: fp32 weights, gradients and SGD's momentum)
# on 4 ranks: without a budget the fastest predicted is chosen whatever its memory; with a budget
# just under its peak (the peak includes the memory a process holds before it builds anything,
# which differs between machines) it is refused and a layout that fits is chosen instead. Among
# data-parallel layouts: over all of them tensor 2 x pipeline 2 with one micro-batch is both the
# fastest and the smallest here.
big="--set model.n_layer=24 --set model.d_model=1024 --set model.n_head=16"
data_only="--set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.context=1"
# shellcheck disable=SC2086
out=$("$strata" tune $base -n 4 --dry-run $big $data_only) || check "unbudgeted search failed: $out"
fastest_peak=$(rows <<<"$out" | head -1 | awk '{print $3}')
budget=$(awk -v peak="$fastest_peak" 'BEGIN {printf "%.2f", (peak - 64) / 1024}')
# shellcheck disable=SC2086
out=$("$strata" tune $base -n 4 --dry-run $big $data_only --memory-gb "$budget") || check "budgeted search failed: $out"
top=$(rows <<<"$out" | head -1)
grep -q "over --memory-gb $budget" <<<"$out" || check "no candidate was over the budget of $budget GiB (the fastest's peak: $fastest_peak MiB): $out"
awk -v budget="$budget" '{exit !($3 <= budget * 1024)}' <<<"$top" || check "the top candidate is over the budget of $budget GiB: $top"
grep -Eq "fsdp|zero" <<<"$top" || check "the top candidate under the budget is not sharded: $top"

# fsdp's and zero2's reduce_every_micro_batch is searched where a step accumulates micro-batches,
# and is no candidate of its own where a step has one (micro_batch 0: global_batch 8 / data 4).
out=$("$strata" tune $base -n 4 --dry-run --top 1000) || check "plain search failed: $out"
rows <<<"$out" | grep "job.micro_batch = 0;" | grep -q "reduce_every_micro_batch = true" \
  && check "a one-micro-batch candidate differs from another only by reduce_every_micro_batch: $out"
rows <<<"$out" | grep "data 4 (fsdp)" | grep "job.micro_batch = 1;" | grep -q "fsdp.reduce_every_micro_batch = true" \
  || check "no accumulating fsdp candidate reduces every micro-batch: $out"
# ... and a budget the accumulated full gradients do not fit in picks it (the 300M model, two
# micro-batches of one sequence per rank): fsdp with it (resharding after forward) peaks lowest,
# zero2 with it next. Without resharding fsdp holds every layer gathered from its forward to its
# backward, above zero2.
out=$("$strata" tune $base -n 4 --dry-run --top 1000 $big --set parallel.data=4 --set job.micro_batch=1) || check "accumulating search failed: $out"
fsdp_every=$(rows <<<"$out" | grep "fsdp.reshard_after_forward = true; pass.fsdp.reduce_every_micro_batch = true" | head -1 | awk '{print $3}')
fsdp_kept=$(rows <<<"$out" | grep "fsdp.reshard_after_forward = false; pass.fsdp.reduce_every_micro_batch = true" | head -1 | awk '{print $3}')
zero2_every=$(rows <<<"$out" | grep "zero2.reduce_every_micro_batch = true" | head -1 | awk '{print $3}')
budget=$(awk -v a="$fsdp_every" -v b="$zero2_every" 'BEGIN {printf "%.2f", (a + b) / 2 / 1024}')
awk -v a="$fsdp_every" -v b="$zero2_every" -v c="$fsdp_kept" 'BEGIN {exit !(a < b && b < c)}' \
  || check "fsdp resharding ($fsdp_every MiB), zero2 ($zero2_every MiB) and fsdp keeping layers gathered ($fsdp_kept MiB) are not in that order"
top=$("$strata" tune $base -n 4 --dry-run $big --set parallel.data=4 --set job.micro_batch=1 --memory-gb "$budget" | rows | head -1)
grep -q "fsdp.reduce_every_micro_batch = true" <<<"$top" \
  || check "under --memory-gb $budget (fsdp reducing every micro-batch: $fsdp_every MiB, zero2: $zero2_every MiB) the top is not fsdp with it: $top"

# Errors: exit status 2 with one line.
"$strata" tune $base -n 4 --dry-run --out /tmp/x 2>&1 | grep -q "measures nothing and writes nothing" || check "--dry-run took --out"
"$strata" tune $base -n 4 --dry-run --set parallel.tensor=3 >/dev/null 2>&1; [ $? -eq 2 ] || check "an impossible fixed size did not exit 2"
"$strata" tune $base -n 4 --dry-run --trial-steps 1+1 2>&1 | grep -q "drop --out, -o, --rounds, --trial-steps" || check "--dry-run took --trial-steps"
for bad in 2 2+0 -1+2 a+b 2+4+1 2+; do
  out=$("$strata" tune $base -n 4 --trial-steps "$bad" 2>&1); status=$?
  [[ $status -eq 2 && $(wc -l <<<"$out") -eq 1 && $out == *"--trial-steps expects warm-up + measured steps"*"got '$bad'"* ]] ||
    check "--trial-steps $bad: exit $status, $out"
done
exit $fail
