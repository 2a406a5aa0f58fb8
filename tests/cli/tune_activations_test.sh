#!/usr/bin/env bash
# tune_activations_test.sh STRATA DIR: the cost model's activations against what trials' tensors
# held. For GPT, Llama, Mixtral (one process), GPT under tensor 2 with and without sequence
# parallel and under pipeline 2 with the zero-bubble schedule (8 micro-batches of one sequence)
# without and with act_checkpoint, a trial of 2 and one of 6 layers (d_model 256, 8 sequences of
# 256 tokens a micro-batch):
# * the difference of their peaks of live tensor bytes (mem_device_peak_bytes, the counting CPU
#   allocator's) is the difference of the predicted activations, model states and transient
#   buffer (tune.jsonl's cost) within 3%; tensor 2 with sequence parallel within 5% (measured
#   2.4% above the prediction here, 3.6% on CI's machine, where the 6 layers' peak held 1.2 MB
#   more and the 2 layers' the same: not found why); tensor 2 without sequence parallel within 8%
#   (measured 6% below the prediction: the estimate keeps 4h of a layer's 16h per token whole on
#   every rank, the two norms' inputs and outputs, where the trials kept about 2.5h whole);
# * each peak is at least that prediction, the 6 layers' at most 10% above it (8 to 19 MB more
#   here, the same at 2 and 6 layers: the data, the embedding's output, the loss's own buffers);
#   not checked without sequence parallel, where the prediction is above the peaks;
# * zero_bubble with act_checkpoint on every layer within 8% (measured 4.3% above the prediction,
#   its 2 layers' peak 1.5% below it: one layer's recomputation does not add to that peak, not
#   checked). Its deferred weight gradients hold each linear's input and output gradient, which
#   checkpointing does not shrink; before they counted apart from the activations, the
#   prediction was a third of the measured peak (50 MB against 148).
# Zero bubble's cases state the schedule in their strategy, so tune measures only that candidate.
# Before attention was counted as Strata runs it (fused, no [s, s] scores), the activations were
# predicted 1.7x too high here, and more at longer sequences; before a micro-batch counted as held
# until its deferred weight gradients ran, zero_bubble was predicted to hold 1F1B's 2 micro-batches
# where it held up to 8.
set -u
strata=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail=0
field() { grep -o "\"$1\":[0-9.e+-]*" | cut -d: -f2 | sort -g | tail -1; }
common="--set job.micro_batch=8 --set model.d_model=256 --set model.n_head=4 --set model.seq_len=256 --rounds 1"
llama="--set job.model=llama --set model.n_kv_head=2"
mixtral="--set job.model=mixtral --set model.n_kv_head=2 --set model.ffn_hidden=768 --set model.n_experts=4 --set model.top_k=2"
zero_bubble="$dir/zero_bubble.toml"
{ cat tests/cli/parity.toml; printf '\n[[pass]]\nname = "pipeline_parallel"\nschedule = "zero_bubble"\n'; } > "$zero_bubble"
{ cat "$zero_bubble"; printf '\n[[pass]]\nname = "act_checkpoint"\nevery = 1\n'; } > "$dir/zero_bubble_act_checkpoint.toml"
# Each case: name, ranks, the tolerance of the difference, whether each peak is checked against its
# prediction, the strategy, the arguments, the measured candidate's choices (a pattern tune.jsonl's
# line matches; a candidate with act_checkpoint only where the strategy states it).
while IFS='|' read -r name ranks tolerance bounded strategy extra choices; do
  declare -A predicted=() measured=()
  export XDG_CACHE_HOME="$dir/cache-$name"  # each case measures its own trials (a cached one has no run directory)
  for layers in 2 6; do
    out="$dir/$name-$layers"
    # shellcheck disable=SC2086
    if ! "$strata" tune "$strategy" -n "$ranks" $common $extra --set model.n_layer=$layers --out "$out" > "$out.log" 2>&1; then
      echo "tune_activations_test: $name, $layers layers: tune failed: $(tail -3 "$out.log")" >&2
      fail=1
      continue 2
    fi
    row=$(grep -E '"trial_wall_s"' "$out/tune.jsonl" | grep -E "$choices" | { grep -q act_checkpoint "$strategy" && cat || grep -v act_checkpoint; } | head -1)
    [ -n "$row" ] || { echo "tune_activations_test: $name: no measured candidate with $choices: $(cat "$out/tune.jsonl")" >&2; fail=1; continue 2; }
    rank=$(field predicted_rank <<<"$row")
    predicted[$layers]=$(awk -v a="$(field activation_bytes <<<"$row")" -v m="$(field model_state_bytes <<<"$row")" \
      -v t="$(field transient_bytes <<<"$row")" 'BEGIN {printf "%.0f", a + m + t}')
    measured[$layers]=$(field mem_device_peak_bytes < "$out/candidate-$rank/metrics.jsonl")
  done
  echo "$name: predicted ${predicted[2]} and ${predicted[6]} bytes, measured ${measured[2]} and ${measured[6]}"
  awk -v p2="${predicted[2]}" -v p6="${predicted[6]}" -v m2="${measured[2]}" -v m6="${measured[6]}" -v tol="$tolerance" -v bounded="$bounded" 'BEGIN {
    dp = p6 - p2; dm = m6 - m2
    printf "  6 layers less 2: predicted %.0f, measured %.0f (%+.1f%%)\n", dp, dm, 100 * (dp - dm) / dm
    exit !(dm > 0 && (dp - dm) / dm < tol && (dm - dp) / dm < tol && (bounded == "no" || (m2 >= p2 && m6 >= p6 && m6 <= 1.1 * p6)))
  }' || { echo "tune_activations_test: $name: the measured peaks are not the predicted ones (see above)" >&2; fail=1; }
done <<EOF2
gpt|1|0.03|yes|tests/cli/parity.toml|--set parallel.data=1 --top 1|"choices":\[\]
llama|1|0.03|yes|tests/cli/parity.toml|--set parallel.data=1 --top 1 $llama|"choices":\[\]
mixtral|1|0.03|yes|tests/cli/parity.toml|--set parallel.data=1 --top 1 $mixtral|"choices":\[\]
gpt_tensor_2_sequence_parallel|2|0.05|yes|tests/cli/parity.toml|--set parallel.data=1 --set parallel.tensor=2 --disable ddp --top 2|sequence_parallel = true
gpt_tensor_2|2|0.08|no|tests/cli/parity.toml|--set parallel.data=1 --set parallel.tensor=2 --disable ddp --top 2|sequence_parallel = false
gpt_pipeline_2_zero_bubble|2|0.03|yes|$zero_bubble|--set parallel.data=1 --set parallel.pipeline=2 --disable ddp --set job.micro_batch=1 --top 1|"choices":\[\]
gpt_pipeline_2_zero_bubble_act_checkpoint|2|0.08|no|$dir/zero_bubble_act_checkpoint.toml|--set parallel.data=1 --set parallel.pipeline=2 --disable ddp --set job.micro_batch=1 --top 1|"choices":\[\]
EOF2
exit $fail
