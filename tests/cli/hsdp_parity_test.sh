#!/usr/bin/env bash
# hsdp_parity_test.sh STRATA STRATEGY WORKDIR
# Hybrid sharding (fsdp shard_size = S over D data ranks) against the single-process fp32 run of
# parity.toml (global batch 12): D x S = 4 x 2 (2 groups of 2), 6 x 3 (2 groups of 3) and 6 x 2
# (3 groups of 2). Every step's loss and gradient norm must agree within a relative 1e-5 (the
# tolerance of data-parallel parity), and each rank's model states must be 1/S of the model's:
# parameters + gradients + AdamW moments = 16 Psi / S bytes, up to each unit's padding to a
# multiple of S (fewer than S elements per unit). The gradient chunks averaged over the replicas
# per step are 4 Psi / S bytes (same padding).
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(--set job.global_batch=12 --disable ddp)
"$strata" run "$strategy" --out "$work/baseline" "${common[@]}" > "$work/baseline.log" 2>&1 || { cat "$work/baseline.log"; exit 1; }
metric() { sed -E "s/.*\"$2\":([^,}]+).*/\\1/" "$1/metrics.jsonl"; }
psi_bytes=$(metric "$work/baseline" mem_params_bytes | tail -1)
units=3  # parity.toml's GPT: two blocks and the root
for case in "4 2" "6 3" "6 2"; do
  read -r data shard <<< "$case"
  out=$work/hsdp_${data}x$shard
  "$strata" run -n "$data" "$strategy" --out "$out" "${common[@]}" --set pass.fsdp.enabled=true --set pass.fsdp.shard_size="$shard" \
    > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
  for what in loss grad_norm; do
    "$(dirname "$0")/same_losses.sh" --field "$what" "hsdp $data x $shard" 1e-5 10 "$work/baseline" "$out"
  done
  tail -1 "$out/metrics.jsonl" | awk -v psi="$psi_bytes" -v s="$shard" -v units="$units" '
    { p = $0; sub(/.*"mem_params_bytes":/, "", p); sub(/[,}].*/, "", p)
      g = $0; sub(/.*"mem_grads_bytes":/, "", g); sub(/[,}].*/, "", g)
      o = $0; sub(/.*"mem_optimizer_bytes":/, "", o); sub(/[,}].*/, "", o)
      r = $0; sub(/.*"fsdp_replica_reduce_bytes":/, "", r); sub(/[,}].*/, "", r)
      want = 4 * psi / s  # psi is the single process parameter bytes, 4 Psi
      printf "  model states per rank %d bytes, 16 Psi / S = %d (+ padding and the step counter); replica all-reduce %d bytes\n", p + g + o, want, r
      slack = 16 * units * s + 8
      if (p + g + o < want || p + g + o > want + slack) exit 1
      if (r < psi / s || r > psi / s + 4 * units * s) exit 1 }'
done
