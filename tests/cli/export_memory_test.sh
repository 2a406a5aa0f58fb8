#!/usr/bin/env bash
# export_memory_test.sh STRATA WORKDIR: `strata ckpt export` and `strata ckpt consolidate` hold a
# few tensors at a time, not the model (core/src/checkpoint/parameter_stream.h): each is filled from
# the checkpoint as it comes up for writing (with the ones written next, up to 8 MiB) and its pages
# go back once written. The peak resident set (ru_maxrss) for a GPT of 38M parameters (151 MB in
# fp32; 455 MB of checkpoint with AdamW's state) stays within 48 MiB of the peak for a GPT of 0.8M
# (what libtorch and the plugins take, the same in both): 21-27 MiB for the export here, where
# filling the model whole took 148. GPT ties lm_head to wte (one parameter, written under two
# names: held until both are written). interop tests load the exports in transformers.
set -uo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "export_memory_test: $1" >&2; fail=1; }
common=(--set job.steps=1 --set job.global_batch=2 --set job.micro_batch=2 --set job.eval_every=0 --set job.checkpoint_every=1
        --set job.threads=1 --set model.seq_len=16)
# The peak resident set of a command, in MiB.
peak() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' "$@"; }

"$strata" run examples/strategies/default.toml --out "$work/small" "${common[@]}" > "$work/small.txt" 2>&1 || check "small run failed"
"$strata" run examples/strategies/default.toml --out "$work/large" "${common[@]}" \
  --set model.d_model=512 --set model.n_layer=12 --set model.n_head=8 > "$work/large.txt" 2>&1 || check "large run failed"
for dtype in fp32 bf16; do
  small=$(peak "$strata" ckpt export "$work/small" "$work/small_$dtype" --dtype $dtype) || check "small $dtype export failed"
  large=$(peak "$strata" ckpt export "$work/large" "$work/large_$dtype" --dtype $dtype --max-shard-size 50MB) || check "large $dtype export failed"
  echo "export $dtype: peak $large MiB for 151 MB of fp32 parameters, $small MiB for 3 MB"
  (( large - small < 48 )) || check "$dtype: the large model's export peaked $((large - small)) MiB above the small one's (at most 48)"
done
small=$(peak "$strata" ckpt consolidate "$work/small" "$work/small.safetensors") || check "small consolidate failed"
large=$(peak "$strata" ckpt consolidate "$work/large" "$work/large.safetensors") || check "large consolidate failed"
echo "consolidate: peak $large MiB for 455 MB of checkpoint, $small MiB for 10 MB"
(( large - small < 48 )) || check "the large checkpoint's consolidation peaked $((large - small)) MiB above the small one's (at most 48)"
exit $fail
