#!/usr/bin/env bash
# tune_measure_test.sh STRATA WORK_DIR: `strata tune` measures the top candidates in fresh
# processes, writes the fastest that ran as a strategy `strata run` takes unchanged and every
# candidate to tune.jsonl (near ties measured three times), which strata report shows; a second tune of the same strategy is answered from the cache; a size
# the strategy fixes is in the strategy tune writes.
set -u
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
export XDG_CACHE_HOME=$work/cache
base=examples/strategies/single_process.toml
sets=(--set data.path=data/kjv.txt --set job.threads=1 --set job.global_batch=4 --set model.seq_len=32)
fail=0
check() { echo "tune_measure_test: $1" >&2; fail=1; }

"$strata" tune $base -n 2 --top 2 --out "$work/tune" "${sets[@]}" > "$work/first.txt" 2>&1 || check "tune failed: $(cat "$work/first.txt")"
cat "$work/first.txt"
[ -f "$work/tune/best.toml" ] || check "no best.toml"
grep -q '"verdict":"best"' "$work/tune/tune.jsonl" || check "tune.jsonl names no best candidate"
[ "$(grep -c '"measured_s"' "$work/tune/tune.jsonl")" -eq 2 ] || check "tune.jsonl does not hold 2 measured candidates"
grep -q '"verdict":"refused: ' "$work/tune/tune.jsonl" || check "tune.jsonl does not list the refused candidates"
grep -q "^# Measured .* s per step" "$work/tune/best.toml" || check "best.toml has no measured header"
# The first trial calibrates the memory predictions: the model's own figure is kept beside them.
grep -q '"predicted_model_bytes"' "$work/tune/tune.jsonl" || check "tune.jsonl has no uncalibrated memory prediction"
# Near ties are measured again, interleaved: three rounds each.
if grep -q "^Confirming the 2 within" "$work/first.txt"; then
  [ "$(grep -c '"measured_rounds_s":\[[^],]*,[^],]*,[^],]*\]' "$work/tune/tune.jsonl")" -eq 2 ] || check "the contenders were not measured three times"
fi
# strata report shows predicted against measured for the tune.
"$strata" report "$work/tune" -o "$work/tune.html" > "$work/report.txt" 2>&1 || check "strata report of the tune failed: $(cat "$work/report.txt")"
grep -q "2 measured of [0-9]* that plan; predicted vs measured step time Spearman" "$work/report.txt" || check "no tune summary: $(cat "$work/report.txt")"
grep -q "step time: measured against predicted" "$work/tune.html" && grep -q "<circle" "$work/tune.html" || check "the report has no predicted-vs-measured chart"
"$strata" run "$work/tune/best.toml" -n 2 --out "$work/run" --set job.steps=2 > "$work/run.txt" 2>&1 || check "best.toml did not train: $(cat "$work/run.txt")"

start=$(date +%s)
"$strata" tune $base -n 2 --top 2 --out "$work/tune2" "${sets[@]}" > "$work/second.txt" 2>&1 || check "second tune failed"
# The ranking depends on rates measured each time, so the top 2 may differ by a near tie; what
# was measured before must come from the cache.
grep -q "(cached)" "$work/second.txt" || check "the second tune measured again: $(cat "$work/second.txt")"
grep -q "^rates: .*; cached, --remeasure measures them again" "$work/second.txt" || check "the second tune measured the rates again"
[ $(( $(date +%s) - start )) -le 20 ] || check "the cached tune took more than 20 s"

# With keys the trials' settings leave unread (evaluations, kept checkpoints, replicated flash
# snapshots): the trials run with them at their defaults, and best.toml keeps the strategy's.
unread=(--set job.eval_every=2 --set job.eval_batches=2 --set job.keep_checkpoints=5 --set job.flash_every=2 --set job.snapshot_replicas=1
  --set job.max_restarts=2 --set job.restart_backoff=5 --set job.min_ranks=1)
"$strata" tune $base -n 2 --top 1 --out "$work/tune3" "${sets[@]}" "${unread[@]}" --set parallel.tensor=2 --remeasure > "$work/third.txt" 2>&1 ||
  check "fixed tensor tune failed: $(cat "$work/third.txt")"
grep -q "^rates: .*cached" "$work/third.txt" && check "--remeasure took the cached rates"
grep -q "^tensor = 2$" "$work/tune3/best.toml" || check "best.toml lost the fixed tensor = 2"
for kept in "eval_batches = 2" "keep_checkpoints = 5" "snapshot_replicas = 1" "restart_backoff = 5" "min_ranks = 1"; do
  grep -q "^$kept$" "$work/tune3/best.toml" || check "best.toml lost $kept"
done
exit $fail
