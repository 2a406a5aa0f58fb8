#!/usr/bin/env bash
# fsdp_sharded_init_test.sh STRATA WORKDIR: fsdp ranks keep only their shards as the model is built
# (issue 58). GPT-2 small (124M) under fsdp 4, amp bf16 and act_checkpoint (examples/strategies/
# fsdp_bf16.toml): each rank's build peak above its resident set before the build is well under the
# whole model's, and the step is bit-identical to the same run built whole. A tiny model under half
# (placeholders change dtype) trains bit-identically both ways; `strata plan` says which way it builds.
# The same bound holds when the model starts from exported weights ([model] init_from).
set -uo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "fsdp_sharded_init_test: $1" >&2; fail=1; }
common=(--set job.threads=1 --set job.eval_every=0 --set job.checkpoint_every=0)
run() {  # NAME STRATEGY RANKS SETTINGS...
  local name=$1 toml=$2 ranks=$3; shift 3
  "$strata" run -n "$ranks" "$toml" --out "$work/$name" "${common[@]}" "$@" > "$work/$name.txt" 2>&1 || check "$name failed: $(tail -5 "$work/$name.txt")"
}
# The build's peak above the resident set before it, in MiB, per rank: "peak P MiB (B MiB before the build)".
above() { sed -n 's/.*model built: .*peak \([0-9]*\) MiB (\([0-9]*\) MiB before the build).*/\1 \2/p' "$work/$1"/logs/rank_*.log | awk '{print $1 - $2}'; }
losses() { grep -o '"loss":[^,]*' "$work/$1/metrics.jsonl"; }

gpt2=(--set job.steps=1 --set job.global_batch=4 --set model.seq_len=8)
run sharded examples/strategies/fsdp_bf16.toml 4 "${gpt2[@]}"
run whole examples/strategies/fsdp_bf16.toml 4 "${gpt2[@]}" --set pass.fsdp.sharded_init=false --set job.checkpoint_at_end=false
grep -q "fsdp kept 30914880 of 123659520 sharded parameters (1/4 of each unit" "$work/sharded/logs/rank_3.log" || check "rank 3 did not keep a quarter"
grep -q "model built: 123659520 parameters held (every block)" "$work/whole/logs/rank_3.log" || check "the whole build did not hold the model"
# Whole: 124M fp32 parameters, 472 MiB. Sharded: a quarter (118 MiB) plus the largest block while
# it is drawn (the embedding, 147 MiB): 265 MiB; measured 265-266 MiB on the 2-core machine.
most_sharded=$(above sharded | sort -n | tail -1) least_whole=$(above whole | sort -n | head -1)
echo "build peak above the resident set before it: sharded at most $most_sharded MiB, whole at least $least_whole MiB"
# Issue 58's target: at most 1.25 x the formula (331 MiB); the whole build is over it.
[ -n "$most_sharded" ] && [ -n "$least_whole" ] && [ "$most_sharded" -le 331 ] && [ "$least_whole" -gt 331 ] ||
  check "sharded build peak ${most_sharded} MiB is over 1.25 x the formula's 265 MiB (whole build: ${least_whole} MiB)"
[ "$(losses sharded)" = "$(losses whole)" ] || check "the sharded build's loss differs: $(losses sharded) vs $(losses whole)"
# [model] init_from under fsdp 4 loads each block as it is built, then keeps its shards (issue 58,
# sharded loading): the same bound holds with the checkpoint mapped (its pages let go slice by slice).
"$strata" ckpt export "$work/sharded" "$work/hf" > /dev/null || check "export failed"
rm -rf "$work/sharded/checkpoints"  # 1.5 GB
run loaded examples/strategies/fsdp_bf16.toml 4 "${gpt2[@]}" --set "model.init_from=$work/hf" --set job.checkpoint_at_end=false
grep -q "fsdp kept 30914880 of 123659520 sharded parameters" "$work/loaded/logs/rank_3.log" || check "init_from did not shard as built"
most_loaded=$(above loaded | sort -n | tail -1)
echo "build peak above the resident set before it with init_from: at most $most_loaded MiB"
[ -n "$most_loaded" ] && [ "$most_loaded" -le 331 ] || check "init_from's sharded build peak ${most_loaded} MiB is over 331 MiB"
rm -rf "$work/hf"
[ ! -e "$work/whole/checkpoints" ] && [ ! -e "$work/loaded/checkpoints" ] || check "checkpoint_at_end = false wrote a checkpoint"

tiny=(--set job.steps=3 --set job.global_batch=4 --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=16)
{ cat examples/strategies/fsdp.toml; printf '\n[[pass]]\nname = "half"\ndtype = "bf16"\n'; } > "$work/half.toml"
run half_sharded "$work/half.toml" 2 "${tiny[@]}"
run half_whole "$work/half.toml" 2 "${tiny[@]}" --set pass.fsdp.sharded_init=false
[ "$(losses half_sharded | wc -l)" -eq 3 ] && [ "$(losses half_sharded)" = "$(losses half_whole)" ] ||
  check "under half the sharded build's losses differ: $(losses half_sharded) vs $(losses half_whole)"

"$strata" plan examples/strategies/fsdp.toml -n 3 --set job.global_batch=6 | grep -q "^fsdp: sharded initialisation: each rank keeps 1/3 of every unit as the model is built$" ||
  check "strata plan does not say the model is sharded as built"
"$strata" plan examples/strategies/fsdp.toml -n 3 --set job.global_batch=6 --set pass.fsdp.sharded_init=false |
  grep -q "^fsdp: every rank builds the whole model, then keeps its shards (sharded_init = false)$" || check "strata plan does not say why the model is built whole"
exit $fail
