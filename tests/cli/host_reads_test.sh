#!/usr/bin/env bash
# The step loop reads nothing from the device except on steps that log, evaluate or checkpoint
# (issue 63): every metrics line carries host_reads, the reads of figures during that step, and a
# run that reads every step (log_every = 1) records the same losses bit for bit. amp bf16 under
# ddp over 3 ranks, so the memory figures' all-reduce is read with the losses.
# With RANKS and more arguments (a pipeline: its idle fractions are device figures, read with the
# losses), the same on RANKS ranks; every line of the deferred run names the same figures as the
# run that reads every step.
# READS_DEFERRED and READS_EVERY replace the expected "step reads" lists (a configuration that
# reads in every step).
#   host_reads_test.sh STRATA STRATEGY WORK_DIR [RANKS [RUN_ARGS...]]
set -euo pipefail
strata=$1 strategy=$2 work=$3 ranks=${4:-3}
shift $(($# < 4 ? $# : 4))
rm -rf "$work" && mkdir -p "$work"
common=(--set job.steps=12 --set job.eval_every=6 --set job.checkpoint_every=4 --set job.threads=1 --set job.global_batch=6
        --set model.seq_len=32 "$@")
"$strata" run -n "$ranks" "$strategy" --out "$work/deferred" "${common[@]}" --set job.log_every=5 > "$work/deferred.log" 2>&1 \
  || { cat "$work/deferred.log"; exit 1; }
"$strata" run -n "$ranks" "$strategy" --out "$work/every" "${common[@]}" --set job.log_every=1 > "$work/every.log" 2>&1 \
  || { cat "$work/every.log"; exit 1; }
reads() { sed -E 's/.*"step":([0-9]+),.*"host_reads":([0-9]+).*/\1 \2/' "$1/metrics.jsonl" | tr '\n' ' '; }
losses() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1/metrics.jsonl"; }
# Read at the logging steps 5 and 10, the checkpoints 4, 8 and 12, the evaluation 6: one read each;
# the evaluations at 6 and 12 read their loss once more (summed on the device over the batches).
expected=${READS_DEFERRED:-"1 0 2 0 3 0 4 1 5 1 6 2 7 0 8 1 9 0 10 1 11 0 12 2 "}
every=${READS_EVERY:-"1 1 2 1 3 1 4 1 5 1 6 2 7 1 8 1 9 1 10 1 11 1 12 2 "}
[ "$(reads "$work/deferred")" = "$expected" ] || { echo "FAIL: host reads per step: $(reads "$work/deferred")"; echo "expected $expected"; exit 1; }
[ "$(reads "$work/every")" = "$every" ] \
  || { echo "FAIL: log_every = 1 reads: $(reads "$work/every")"; exit 1; }
diff <(losses "$work/deferred") <(losses "$work/every") || { echo "FAIL: the losses differ when read later"; exit 1; }
[ "$(wc -l < "$work/deferred/metrics.jsonl")" -eq 12 ] || { echo "FAIL: not one metrics line per step"; exit 1; }
names() { sed -E 's/:[^,}]*//g' "$1/metrics.jsonl"; }
diff <(names "$work/deferred") <(names "$work/every") || { echo "FAIL: a step read later lacks figures"; exit 1; }
echo "OK: reads only at steps 4 5 6 8 10 12; losses identical to reading every step"
