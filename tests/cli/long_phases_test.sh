#!/usr/bin/env bash
# long_phases_test.sh STRATA STRATEGY WORKDIR
# An evaluation of many batches and a long checkpoint save are progress, not hangs: with
# [job] hang_timeout = 2 s, rank 0's evaluation and its disk save of step 6 are slowed through
# STRATA_FAULT (200 ms per validation batch and per written piece: about 8 s and 3.6 s in all, each
# pause far under 2 s). The run must finish with no failure and no restart, its metrics equal to
# an unslowed run's. (A rank that stops beating is still a hang: chaos.stop_a_rank_ddp.)
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=8 --set job.checkpoint_every=6 --set job.eval_every=6 --set job.eval_batches=40 --set job.log_every=2
       --set job.global_batch=4 --set job.micro_batch=2 --set job.threads=1 --set job.max_restarts=1 --set job.restart_backoff=0.1
       --set job.hang_timeout=2 --set model.n_layer=1 --set model.seq_len=32)
metrics() { sed -E 's/"[a-z_]*_ms":[^,}]*,?//g; s/"mem_peak_bytes":[^,}]*,?//g' "$1"; }
"$strata" run -n 2 "$strategy" --out "$work/plain" "${small[@]}" > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; exit 1; }
STRATA_FAULT="slow_evaluation 0 6;slow_checkpoint 0 6" "$strata" run -n 2 "$strategy" --out "$work/slow" "${small[@]}" > "$work/slow.log" 2>&1 ||
  { echo "the slowed run failed:"; cat "$work/slow.log"; exit 1; }
if grep -q '"event":"failure"' "$work/slow/events.jsonl" || ! grep -q '"event":"finish".*"restarts":0' "$work/slow/events.jsonl"; then
  echo "a long evaluation or save was taken for a hang:"; cat "$work/slow/events.jsonl"; exit 1
fi
checkpoint_ms=$(grep '"step":6,' "$work/slow/metrics.jsonl" | grep -o '"checkpoint_ms":[0-9.]*' | cut -d: -f2)
awk -v ms="$checkpoint_ms" 'BEGIN { exit !(ms > 2000) }' || { echo "the save of step 6 took $checkpoint_ms ms: it was not slowed past the deadline"; exit 1; }
diff <(metrics "$work/plain/metrics.jsonl") <(metrics "$work/slow/metrics.jsonl") || { echo "the slowed run's metrics differ"; exit 1; }
echo "evaluation and a ${checkpoint_ms} ms save past hang_timeout = 2 s: no hang declared, metrics equal"
