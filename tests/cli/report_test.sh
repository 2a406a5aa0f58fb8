#!/usr/bin/env bash
# report_test.sh STRATA STRATEGY WORKDIR
# Two short runs with different learning rates, one report of both: the file must be
# self-contained (no script, no external reference of any kind) and hold both runs' curves in
# every chart, the validation loss, and each run's strategy.
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=4 --set job.eval_every=2 --set job.log_every=2 --set job.threads=1 --set model.n_layer=1 --set model.seq_len=32)
"$strata" run "$strategy" --out "$work/lr_low" "${small[@]}" --set optimizer.lr=1e-4 > /dev/null
"$strata" run "$strategy" --out "$work/lr_high" "${small[@]}" --set optimizer.lr=1e-3 > /dev/null
"$strata" report "$work/lr_low" "$work/lr_high" -o "$work/report.html" > "$work/report.log"
grep -q "wrote $work/report.html (2 runs)" "$work/report.log" || { cat "$work/report.log"; exit 1; }
html=$work/report.html
fail() { echo "report: $1"; exit 1; }
! grep -Eqi '<script|<link|<img|<iframe|@import|url\(|https?:' "$html" || fail "refers to something outside the file: $(grep -Eoi '<script|<link|<img|<iframe|@import|url\(|https?:[^"]*' "$html" | head -3)"
charts=$(grep -o 'class="title">' "$html" | wc -l)
for run in lr_low lr_high; do
  lines=$(grep -o "<polyline data-run=\"$run\"" "$html" | wc -l)
  # loss, learning rate, tokens/s, step time, peak memory, gradient norm, checkpoint blocking (the final save)
  (( lines == 7 )) || fail "$run has $lines curves, expected 7"
  grep -q "<polyline data-run=\"$run (validation)\"" "$html" || fail "$run has no validation loss curve"
  grep -q "<summary>$run (" "$html" || fail "$run's strategy is missing"
done
# Each curve has one point per step.
points=$(grep -o '<polyline data-run="lr_low" [^>]*points="[^"]*"' "$html" | head -1 | sed 's/.*points="//; s/"$//' | wc -w)
(( points == 4 )) || fail "the loss curve of lr_low has $points points, expected 4"
echo "report: $charts charts, both runs in each, validation loss dashed, self-contained ($(wc -c < "$html") bytes)"
