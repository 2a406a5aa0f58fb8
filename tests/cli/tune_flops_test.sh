#!/usr/bin/env bash
# tune_flops_test.sh STRATA DIR: the FLOPs tune predicts per token (tune.jsonl's cost over the
# step's tokens) against the model's own count, the one MFU is reported with (6 N + 12 L h s, N
# the parameters a token computes with), for GPT and for Mixtral, whose unchosen experts a token
# does not compute with: 4 experts, top_k 2. The model's count is read off the console of a run
# with a tiny peak_tflops, where MFU printed to 2 decimals carries 8 significant digits. Before
# tune counted the active parameters, it predicted 1.57x the Mixtral model's FLOPs here.
set -euo pipefail
strata=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
export XDG_CACHE_HOME=$dir/cache
fail=0
for strategy in tests/cli/parity.toml tests/cli/mixtral.toml; do
  name=$(basename "$strategy" .toml)
  "$strata" tune "$strategy" -n 1 --set parallel.data=1 --top 1 --rounds 1 --out "$dir/$name-tune" > "$dir/$name-tune.log" 2>&1 ||
    { echo "$name: tune failed: $(tail -3 "$dir/$name-tune.log")"; exit 1; }
  row=$(grep '"trial_wall_s"' "$dir/$name-tune/tune.jsonl" | head -1)
  flops=$(grep -o '"flops":[0-9.e+]*' <<<"$row" | cut -d: -f2)
  tokens=$(grep -o '"tokens":[0-9]*' "$dir/$name-tune/candidate-1/metrics.jsonl" | head -1 | cut -d: -f2)
  "$strata" run "$strategy" --set job.steps=2 --set job.log_every=1 --set job.peak_tflops=0.000001 --set job.checkpoint_at_end=false \
    --out "$dir/$name-run" > "$dir/$name-run.log" 2>&1 || { cat "$dir/$name-run.log"; exit 1; }
  line=$(grep '^step 2/2' "$dir/$name-run.log")
  tok_s=$(sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' <<<"$line")
  mfu=$(sed -E 's/.*\| mfu ([0-9.]+)%.*/\1/' <<<"$line")
  awk -v name="$name" -v f="$flops" -v t="$tokens" -v r="$tok_s" -v m="$mfu" 'BEGIN {
    predicted = f / t; model = m / 100 * 1e6 / r
    printf "%s: tune predicts %.0f FLOPs per token, the model counts %.0f (%+.2f%%)\n", name, predicted, model, 100 * (predicted - model) / model
    exit !(predicted < 1.01 * model && predicted > 0.99 * model)
  }' || { echo "$name: tune's FLOPs are not the model's"; fail=1; }
done
exit $fail
