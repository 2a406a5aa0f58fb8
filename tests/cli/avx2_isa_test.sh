#!/usr/bin/env bash
# avx2_isa_test.sh STRATA WORKDIR
# The default job on a CPU limited to AVX2 (issue 57: on an AMD EPYC without AVX-512 it died at
# its first step in oneDNN's matmul). On any x86-64 machine, ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN
# refuse what it refuses on such a CPU and ATEN_CPU_CAPABILITY=avx2 runs ATen's AVX2 kernels:
# `strata ops` must say the weight gradient went to MKL and why, and the default job must train
# on one rank and on two.
set -euo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
"$strata" ops > "$work/ops.txt" 2>&1 || { cat "$work/ops.txt"; echo "FAIL: strata ops"; exit 1; }
grep -E "^CPU paths on this machine \(.*ATen kernels AVX2; ONEDNN_MAX_CPU_ISA=AVX2\)$" "$work/ops.txt" ||
  { cat "$work/ops.txt"; echo "FAIL: strata ops names no CPU or ISA limit"; exit 1; }
grep -E "^  Linear weight gradient \(fp32\): MKL \(at::mm\) - (this CPU has no AVX-512|oneDNN's matmul refused a trial call)" "$work/ops.txt" ||
  { cat "$work/ops.txt"; echo "FAIL: the weight gradient is not on MKL, or no reason given"; exit 1; }
for ranks in 1 2; do
  "$strata" run -n "$ranks" examples/strategies/default.toml --out "$work/run_$ranks" --set job.steps=5 --set job.eval_every=0 \
    --set job.checkpoint_every=0 --set job.threads=1 > "$work/run_$ranks.txt" 2>&1 ||
    { cat "$work/run_$ranks.txt"; echo "FAIL: the default job on $ranks rank(s)"; exit 1; }
  grep -q '"step":5' "$work/run_$ranks/metrics.jsonl" || { echo "FAIL: no step 5 on $ranks rank(s)"; exit 1; }
  grep -q "cpu path onednn_matmul (Linear weight gradient (fp32)): MKL (at::mm)" "$work/run_$ranks/logs/rank_0.log" ||
    { echo "FAIL: the rank log does not record the weight gradient's path"; exit 1; }
done
echo "OK: the default job trained on 1 and 2 ranks with oneDNN and ATen limited to AVX2"
