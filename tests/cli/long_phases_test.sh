#!/usr/bin/env bash
# long_phases_test.sh STRATA STRATEGY WORKDIR
# An evaluation of many batches and a long checkpoint save are progress, not hangs: with
# [job] hang_timeout = 2 s, rank 0's evaluation and its disk save of step 6 are slowed through
# STRATA_FAULT (200 ms per validation batch and per written piece: about 8 s and 3.6 s in all, each
# pause far under 2 s). The run must finish with no failure and no restart, its metrics equal to
# an unslowed run's. (A rank that stops beating is still a hang: chaos.stop_a_rank_ddp.) Then a
# resume whose restore is slowed past [job] start_timeout.
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=8 --set job.checkpoint_every=6 --set job.eval_every=6 --set job.eval_batches=40 --set job.log_every=2
       --set job.global_batch=4 --set job.micro_batch=2 --set job.threads=1 --set job.max_restarts=1 --set job.restart_backoff=0.1
       --set job.hang_timeout=2 --set model.n_layer=1 --set model.seq_len=32)
metrics() { sed -E 's/"[a-z_]*_ms":[^,}]*,?//g; s/"mem_(device_)?peak_bytes":[^,}]*,?//g' "$1"; }
"$strata" run -n 2 "$strategy" --out "$work/plain" "${small[@]}" > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; exit 1; }
STRATA_FAULT="slow_evaluation 0 6;slow_checkpoint 0 6" "$strata" run -n 2 "$strategy" --out "$work/slow" "${small[@]}" > "$work/slow.log" 2>&1 ||
  { echo "the slowed run failed:"; cat "$work/slow.log"; exit 1; }
if grep -q '"event":"failure"' "$work/slow/events.jsonl" || ! grep -q '"event":"finish".*"restarts":0' "$work/slow/events.jsonl"; then
  echo "a long evaluation or save was taken for a hang:"; cat "$work/slow/events.jsonl"; exit 1
fi
checkpoint_ms=$(grep '"step":6,' "$work/slow/metrics.jsonl" | grep -o '"checkpoint_ms":[0-9.]*' | cut -d: -f2)
awk -v ms="$checkpoint_ms" 'BEGIN { exit !(ms > 2000) }' || { echo "the save of step 6 took $checkpoint_ms ms: it was not slowed past the deadline"; exit 1; }
diff <(metrics "$work/plain/metrics.jsonl") <(metrics "$work/slow/metrics.jsonl") || { echo "the slowed run's metrics differ"; exit 1; }
# A resume whose checksums and restore take longer than [job] start_timeout = 3 s (200 ms per 4 MiB
# hashed and per tensor read) is no start-up hang either: it resumes at step 8 and trains on.
STRATA_FAULT="slow_restore 0 0" "$strata" run -n 2 "$work/slow/strategy.toml" --out "$work/slow" --resume --set job.steps=10 \
  --set job.start_timeout=3 > "$work/resume.log" 2>&1 || { echo "the slowed resume failed:"; cat "$work/resume.log"; exit 1; }
resume_events=$(tac "$work/slow/events.jsonl" | sed '/"event":"start"/q' | tac)
resume_s=$(grep -o '"wall_s":[0-9.]*' <<<"$resume_events" | cut -d: -f2)
if grep -q '"event":"failure"' <<<"$resume_events" || ! grep -q '"event":"finish".*"step":10,"restarts":0' <<<"$resume_events" ||
   ! grep -q "resumed from .*step_00000008 at step 8" "$work/resume.log" || ! awk -v s="$resume_s" 'BEGIN { exit !(s > 3) }'; then
  echo "a long restore was taken for a hang, or was not slowed past start_timeout:"; echo "$resume_events"; cat "$work/resume.log"; exit 1
fi
echo "evaluation and a ${checkpoint_ms} ms save past hang_timeout = 2 s, a ${resume_s} s resume past start_timeout = 3 s: no hang declared, metrics equal"
