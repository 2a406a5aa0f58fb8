#!/usr/bin/env bash
# export_memory_test.sh STRATA WORKDIR: `strata ckpt export` holds one parameter at a time, not the
# model (core/src/checkpoint/parameter_stream.h): each parameter is filled from the checkpoint as
# the tensors viewing it are written and its pages go back after. The export's peak resident set
# (ru_maxrss) for a GPT of 38M parameters (151 MB in fp32) stays within a quarter of the model of
# the peak for a GPT of 0.8M (what libtorch and the plugins take, the same in both); filled whole,
# it was above by the whole model and more. GPT ties lm_head to wte (one parameter, two names in
# transformers' files: the stream keeps it until both are written). Both exports, in fp32 and
# bf16, load as the old ones did: interop tests compare them with transformers.
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
  (( large - small < 36 )) || check "$dtype: the large model's export peaked $((large - small)) MiB above the small one's (at most 36)"
done
exit $fail
