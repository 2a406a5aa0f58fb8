#!/usr/bin/env bash
# accelerate_parity_test.sh EXAMPLES_BUILD_DIR EXAMPLES_SOURCE_DIR WORKDIR MPIRUN [MPIRUN FLAGS...]
# Programs that keep their own model and train it through the library API (sdk/examples), each
# rank running the program under mpirun, against one process with no passes: every step's loss
# must agree within a relative 2e-6.
#  * mlp_lm (a model written as blocks): tensor parallel on 2 and 3 ranks, ddp on 3; as a causal
#    MLP-Mixer (model.token_mixing, a transformer variant) tensor parallel on 2 ranks; tensor
#    parallel on 2 ranks with fused_loss (the head, kept whole, computed by the fused operator);
#  * plain_module (a plain torch::nn::Module): ddp 2, fsdp 2 and 3, zero2 2, fsdp 2 with
#    act_checkpoint (the module recomputed as one block); fsdp 2 with amp bf16 trains (within
#    2e-2); a tensor-parallel layout is refused with the way out; the same network as a
#    torch::nn::Sequential: one process bit for bit, fsdp 2 with and without act_checkpoint of
#    the child named "hidden";
#  * Strategy::automatic on 2 ranks measures three candidates and trains the fastest.
set -euo pipefail
bin=$1 examples=$2 work=$3
shift 3
mpirun=("$@")
rm -rf "$work" && mkdir -p "$work"
run() {  # PROGRAM NAME RANKS SETTINGS...
  local program=$1 name=$2 ranks=$3
  shift 3
  local launch=()
  ((ranks > 1)) && launch=("${mpirun[@]}" -np "$ranks")
  (cd "$work" && "${launch[@]}" "$bin/train_$program" "$examples/$program/strategy.toml" job.run_dir="$work/$name" job.steps=12 "$@" \
    > "$work/$name.log" 2>&1) || { cat "$work/$name.log"; exit 1; }
}
compare() {  # BASELINE RUN [TOLERANCE]
  "$(dirname "$0")/same_losses.sh" "$2" "${3:-2e-6}" 12 "$work/$1" "$work/$2"
}

one=(parallel.tensor=1 pass.tensor_parallel.enabled=false)
run mlp_lm mlp_baseline 1 "${one[@]}"
run mlp_lm mlp_tensor2 2
run mlp_lm mlp_baseline_width24 1 "${one[@]}" model.width=24
run mlp_lm mlp_tensor3 3 parallel.tensor=3 model.width=24
run mlp_lm mlp_baseline_batch6 1 "${one[@]}" job.global_batch=6
run mlp_lm mlp_ddp3 3 "${one[@]}" parallel.data=3 pass.ddp.enabled=true job.global_batch=6
compare mlp_baseline mlp_tensor2
compare mlp_baseline_width24 mlp_tensor3
compare mlp_baseline_batch6 mlp_ddp3
run mlp_lm mixer_baseline 1 "${one[@]}" model.token_mixing=true
run mlp_lm mixer_tensor2 2 model.token_mixing=true
compare mixer_baseline mixer_tensor2
# fused_loss on the program's whole head under tensor parallel: each tensor rank computes the
# whole-vocabulary fused loss (the model keeps its output projection whole).
{ cat "$examples/mlp_lm/strategy.toml"; printf '[[pass]]\nname = "fused_loss"\n'; } > "$work/mlp_fused_loss.toml"
(cd "$work" && "${mpirun[@]}" -np 2 "$bin/train_mlp_lm" "$work/mlp_fused_loss.toml" job.run_dir="$work/mlp_tensor2_fused_loss" job.steps=12 \
  > "$work/mlp_tensor2_fused_loss.log" 2>&1) || { cat "$work/mlp_tensor2_fused_loss.log"; exit 1; }
grep -q "^fused_loss: head.out and the cross entropy computed by " "$work/mlp_tensor2_fused_loss.log" ||
  { echo "fused_loss did not say what computes the loss"; cat "$work/mlp_tensor2_fused_loss.log"; exit 1; }
compare mlp_baseline mlp_tensor2_fused_loss

fp32=(pass.amp.enabled=false)
run plain_module plain_baseline 1 parallel.data=1 pass.fsdp.enabled=false "${fp32[@]}"
run plain_module plain_ddp2 2 pass.fsdp.enabled=false pass.ddp.enabled=true "${fp32[@]}"
run plain_module plain_fsdp2 2 "${fp32[@]}"
run plain_module plain_fsdp2_amp 2
run plain_module plain_baseline_batch6 1 parallel.data=1 pass.fsdp.enabled=false "${fp32[@]}" job.global_batch=6
run plain_module plain_fsdp3 3 parallel.data=3 "${fp32[@]}" job.global_batch=6
compare plain_baseline plain_ddp2
compare plain_baseline plain_fsdp2
compare plain_baseline_batch6 plain_fsdp3
compare plain_baseline plain_fsdp2_amp 2e-2
# The passes the example's strategy does not list, appended to a copy of it.
with_passes() {  # NAME PASS...: writes $work/NAME.toml
  local name=$1
  shift
  { cat "$examples/plain_module/strategy.toml"; for pass in "$@"; do printf '[[pass]]\nname = "%s"\n' "$pass"; done; } > "$work/$name.toml"
}
run_file() {  # STRATEGY NAME RANKS SETTINGS...: as run, with another strategy file
  local strategy=$1 name=$2 ranks=$3
  shift 3
  local launch=()
  ((ranks > 1)) && launch=("${mpirun[@]}" -np "$ranks")
  (cd "$work" && "${launch[@]}" "$bin/train_plain_module" "$strategy" job.run_dir="$work/$name" job.steps=12 "$@" > "$work/$name.log" 2>&1) ||
    { cat "$work/$name.log"; exit 1; }
}
with_passes plain_zero2 zero2
run_file "$work/plain_zero2.toml" plain_zero2 2 pass.fsdp.enabled=false "${fp32[@]}"
compare plain_baseline plain_zero2
with_passes plain_act_checkpoint act_checkpoint
run_file "$work/plain_act_checkpoint.toml" plain_fsdp2_act_checkpoint 2 "${fp32[@]}"
compare plain_baseline plain_fsdp2_act_checkpoint

# The same network as a torch::nn::Sequential (--sequential): its children become blocks, built
# in the same order, so one process gives the plain module's losses; fsdp shards child by child,
# and act_checkpoint recomputes the child it names (one block per micro-batch, by its metrics).
run_sequential() {  # STRATEGY NAME RANKS SETTINGS...
  local strategy=$1 name=$2 ranks=$3
  shift 3
  local launch=()
  ((ranks > 1)) && launch=("${mpirun[@]}" -np "$ranks")
  (cd "$work" && "${launch[@]}" "$bin/train_plain_module" --sequential "$strategy" job.run_dir="$work/$name" job.steps=12 "$@" \
    > "$work/$name.log" 2>&1) || { cat "$work/$name.log"; exit 1; }
}
run_sequential "$examples/plain_module/strategy.toml" sequential_one 1 parallel.data=1 pass.fsdp.enabled=false "${fp32[@]}"
run_sequential "$examples/plain_module/strategy.toml" sequential_fsdp2 2 "${fp32[@]}"
{ cat "$examples/plain_module/strategy.toml"; printf '[[pass]]\nname = "act_checkpoint"\nblocks = ["hidden"]\n'; } > "$work/sequential_ac.toml"
run_sequential "$work/sequential_ac.toml" sequential_fsdp2_act_checkpoint_hidden 2 "${fp32[@]}"
compare plain_baseline sequential_one 0
compare plain_baseline sequential_fsdp2
compare plain_baseline sequential_fsdp2_act_checkpoint_hidden
grep -q '"recomputed_blocks":1.000' "$work/sequential_fsdp2_act_checkpoint_hidden/metrics.jsonl" ||
  { echo "act_checkpoint did not recompute the named child"; exit 1; }

with_passes plain_tensor2 tensor_parallel
set +e
(cd "$work" && "${mpirun[@]}" -np 2 "$bin/train_plain_module" "$work/plain_tensor2.toml" job.run_dir="$work/plain_tensor2" \
  parallel.data=1 parallel.tensor=2 pass.fsdp.enabled=false > "$work/plain_tensor2.log" 2>&1)
status=$?
set -e
grep -q "is a plain torch::nn::Module, which \[parallel\] tensor cannot split: write it as blocks" "$work/plain_tensor2.log" && ((status != 0)) ||
  { echo "a tensor layout of a plain module was not refused (exit $status)"; cat "$work/plain_tensor2.log"; exit 1; }
echo "plain_module: tensor 2 refused"

# Strategy::automatic on 2 ranks: the example's job without [parallel] or passes; the cost
# model's best three are trained a few steps each in the program, and the fastest trains on.
sed '/^\[parallel\]/,$d' "$examples/mlp_lm/strategy.toml" > "$work/mlp_automatic.toml"
(cd "$work" && "${mpirun[@]}" -np 2 "$bin/train_mlp_lm" --automatic "$work/mlp_automatic.toml" job.run_dir="$work/mlp_automatic" \
  job.steps=12 > "$work/mlp_automatic.log" 2>&1) || { cat "$work/mlp_automatic.log"; exit 1; }
grep -q "automatic strategy: .*measured in this process" "$work/mlp_automatic.log" && grep -q "last step 12 loss" "$work/mlp_automatic.log" &&
  [[ -f "$work/mlp_automatic.trials/candidate_3/metrics.jsonl" ]] || { echo "automatic did not measure"; cat "$work/mlp_automatic.log"; exit 1; }
grep -o "automatic strategy: .*" "$work/mlp_automatic.log"

# fp8 on a plain module: its torch::nn::Linear layers cannot be rewritten; refused with the way out.
with_passes plain_fp8 fp8
set +e
(cd "$work" && "$bin/train_plain_module" "$work/plain_fp8.toml" job.run_dir="$work/plain_fp8" parallel.data=1 pass.fsdp.enabled=false \
  "${fp32[@]}" > "$work/plain_fp8.log" 2>&1)
status=$?
set -e
grep -q "torch::nn::Linear layers cannot run in fp8 .*write them as strata::nn::Linear" "$work/plain_fp8.log" && ((status == 2)) ||
  { echo "fp8 of a plain module was not refused (exit $status)"; cat "$work/plain_fp8.log"; exit 1; }
echo "plain_module: fp8 refused"

# An unreadable strategy file: one line from rank 0, exit status 2 (no abort, no line per rank).
for program in mlp_lm plain_module; do
  set +e
  (cd "$work" && "${mpirun[@]}" -np 2 "$bin/train_$program" "$work/no_such_strategy.toml" > "$work/${program}_no_file.log" 2>&1)
  status=$?
  set -e
  [[ $(grep -c "^train_$program: cannot read strategy file .*no_such_strategy.toml$" "$work/${program}_no_file.log") == 1 ]] && ((status != 0)) &&
    ! grep -q "terminate called" "$work/${program}_no_file.log" ||
    { echo "$program: an unreadable strategy file was not one line (exit $status)"; cat "$work/${program}_no_file.log"; exit 1; }
done
echo "mlp_lm, plain_module: an unreadable strategy file is one line"
