#!/usr/bin/env bash
# expert_parallel_estimate_test.sh STRATA DIR: tune's estimate of expert parallel against its
# trials. Mixtral (examples/strategies/mixtral.toml: 4 MoE layers of 8 experts, top_k 2) at data
# 2 x expert 2 under ddp, zero1, zero2 and fsdp:
# * the model states a rank holds (mem_params_bytes + mem_grads_bytes + mem_optimizer_bytes)
#   within 1% of the predicted model_state_bytes: each rank keeps half the experts, and the
#   data-parallel pass shards the rest as it shards them (measured: exact to 0.02%; before expert
#   parallel had an estimate, every rank was predicted to hold every expert);
# * the all-to-all bytes `strata plan` shows (and the estimate adds: 4 x dispatch bytes per MoE
#   layer and micro-batch) within 3% of each step's moe_all_to_all_bytes (uniform routing against
#   the router's: measured from 1.8% below to 2.0% above);
# * with the expert size left unset, tune searches it: at 2 ranks, data 2 with and without
#   expert 2 among the candidates (and no expert size for a model without experts).
set -euo pipefail
strata=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
strategy=$dir/mixtral.toml
{ cat examples/strategies/mixtral.toml
  printf '\n[[pass]]\nname = "%s"\nenabled = false\n' zero1 zero2 fsdp; } > "$strategy"
unsized=$dir/mixtral_unsized.toml
grep -v '^expert = 2$' "$strategy" > "$unsized"
XDG_CACHE_HOME=$dir/cache-search "$strata" tune "$unsized" -n 2 --dry-run --top 100 > "$dir/search.txt" 2>&1 || { cat "$dir/search.txt"; exit 1; }
grep -qE '^ +[0-9]+ .* data 2 \(ddp\) x expert 2 \(expert_parallel\) ' "$dir/search.txt" &&
  grep -qE '^ +[0-9]+ .* data 2 \(ddp\) +- *$' "$dir/search.txt" ||
  { echo "tune did not search the expert size:"; cat "$dir/search.txt"; exit 1; }
XDG_CACHE_HOME=$dir/cache-search "$strata" tune tests/cli/parity.toml -n 2 --dry-run --top 100 > "$dir/dense.txt" 2>&1 || { cat "$dir/dense.txt"; exit 1; }
if grep -q "expert" "$dir/dense.txt"; then echo "tune searched an expert size for a model without experts:"; cat "$dir/dense.txt"; exit 1; fi
echo "tune searches the expert size for Mixtral, not for GPT"
field() { grep -o "\"$1\":[0-9.e+-]*" | cut -d: -f2 | tail -1; }
fail=0
for pass in ddp zero1 zero2 fsdp; do
  select=()
  [[ $pass == ddp ]] || select=(--disable ddp --set "pass.$pass.enabled=true")
  out=$dir/$pass
  XDG_CACHE_HOME=$dir/cache-$pass "$strata" tune "$strategy" -n 2 --set parallel.data=2 --set parallel.tensor=1 --set parallel.pipeline=1 \
    --set parallel.context=1 "${select[@]}" --set job.steps=4 --top 1 --rounds 1 --out "$out" > "$out.log" 2>&1 ||
    { echo "$pass: tune failed: $(tail -3 "$out.log")"; exit 1; }
  row=$(grep '"trial_wall_s"' "$out/tune.jsonl" | head -1)
  rank=$(field predicted_rank <<<"$row")
  last=$(tail -1 "$out/candidate-$rank/metrics.jsonl")
  predicted=$(field model_state_bytes <<<"$row")
  measured=$(awk -v p="$(field mem_params_bytes <<<"$last")" -v g="$(field mem_grads_bytes <<<"$last")" \
    -v o="$(field mem_optimizer_bytes <<<"$last")" 'BEGIN {printf "%.0f", p + g + o}')
  awk -v pass="$pass" -v p="$predicted" -v m="$measured" 'BEGIN {
    printf "%s: model states predicted %.0f bytes a rank, held %.0f (%+.2f%%)\n", pass, p, m, 100 * (p - m) / m
    exit !(p < 1.01 * m && p > 0.99 * m) }' || { echo "$pass: the predicted model states are not the held ones"; fail=1; }
done
# One micro-batch a step, 4 MoE layers: 16 x the dispatch bytes a step.
"$strata" plan -n 2 "$strategy" > "$dir/plan.txt" 2>&1 || { cat "$dir/plan.txt"; exit 1; }
dispatch=$(sed -nE 's/.*fp32: ([0-9]+) bytes sent per rank to dispatch.*/\1/p' "$dir/plan.txt")
[[ -n $dispatch ]] || { echo "strata plan shows no all-to-all bytes:"; cat "$dir/plan.txt"; exit 1; }
while read -r sent; do
  awk -v p="$((16 * dispatch))" -v m="$sent" 'BEGIN {
    printf "all-to-all bytes a step: predicted %.0f, sent %.0f (%+.1f%%)\n", p, m, 100 * (p - m) / m
    exit !(p < 1.03 * m && p > 0.97 * m) }' || { echo "the all-to-all bytes are not the predicted ones"; fail=1; }
done < <(grep -o '"moe_all_to_all_bytes":[0-9.]*' "$dir/ddp/candidate-1/metrics.jsonl" | cut -d: -f2)
exit $fail
