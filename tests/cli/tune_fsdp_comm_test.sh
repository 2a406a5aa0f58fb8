#!/usr/bin/env bash
# tune_fsdp_comm_test.sh STRATA DIR: the cost model's fsdp traffic against what a trial moved.
# fsdp 2 on tests/cli/parity.toml, 4 micro-batches a step, for each of reshard_after_forward and
# reduce_every_micro_batch: the predicted bytes a rank sends a step (tune.jsonl's cost.comm_bytes)
# equal (d-1)/d of the bytes the trial's last step all-gathered and reduce-scattered
# (fsdp_gather_bytes + fsdp_reduce_bytes, full sizes) within 1%. Before the estimate counted a
# layer's gathers per micro-batch it predicted 2x the weights whatever the micro-batches.
set -u
strata=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
export XDG_CACHE_HOME="$dir/cache"
fail=0
field() { grep -o "\"$1\":[0-9.e+-]*" | tail -1 | cut -d: -f2; }
for reshard in true false; do
  for every in false true; do
    out="$dir/r$reshard-e$every"
    if ! "$strata" tune tests/cli/parity.toml -n 2 --disable ddp --set pass.fsdp.enabled=true --set parallel.data=2 --set job.micro_batch=1 \
      --set pass.fsdp.reshard_after_forward=$reshard --set pass.fsdp.reduce_every_micro_batch=$every \
      --trial-steps 1+1 --top 1 --rounds 1 --out "$out" > "$out.log" 2>&1; then
      echo "tune_fsdp_comm_test: tune failed (reshard_after_forward=$reshard, reduce_every_micro_batch=$every): $(tail -3 "$out.log")" >&2
      fail=1
      continue
    fi
    predicted=$(grep "\"verdict\":\"best\"" "$out/tune.jsonl" | field comm_bytes)
    gathered=$(tail -1 "$out/candidate-1/metrics.jsonl" | field fsdp_gather_bytes)
    reduced=$(tail -1 "$out/candidate-1/metrics.jsonl" | field fsdp_reduce_bytes)
    echo "reshard_after_forward=$reshard reduce_every_micro_batch=$every: predicted $predicted bytes sent, measured (1/2)($gathered + $reduced)"
    awk -v p="$predicted" -v g="$gathered" -v r="$reduced" 'BEGIN {m = (g + r) / 2; exit !(m > 0 && (p - m) / m < 0.01 && (m - p) / m < 0.01)}' \
      || { echo "tune_fsdp_comm_test: predicted $predicted bytes, measured (1/2)($gathered + $reduced)" >&2; fail=1; }
  done
done
exit $fail
