#!/usr/bin/env bash
# Data-parallel replicas write no byte twice: the checkpoint of a 4-rank ddp run is as large as
# the single-process one but for per-rank state (each rank's RNG) and file headers; and it
# resumes. Before, every rank wrote the whole model and optimizer state (4x the bytes).
#   replica_bytes_test.sh STRATA STRATEGY WORK_DIR
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(--set job.steps=2 --set job.eval_every=0 --set job.threads=1 --set job.global_batch=8)
"$strata" run -n 1 "$strategy" --out "$work/dp1" "${common[@]}" > "$work/dp1.log" 2>&1 || { cat "$work/dp1.log"; exit 1; }
"$strata" run -n 4 "$strategy" --out "$work/dp4" "${common[@]}" > "$work/dp4.log" 2>&1 || { cat "$work/dp4.log"; exit 1; }
bytes() { du -sb "$1"/checkpoints/step_* | awk '{print $1}'; }
one=$(bytes "$work/dp1") four=$(bytes "$work/dp4")
echo "checkpoint bytes: 1 rank $one, 4 ranks $four (difference $((four - one)))"
# Per extra rank: its RNG state (about 5 KB) and its file's header.
[ $((four - one)) -lt 65536 ] || { echo "FAIL: 4 ranks wrote $((four - one)) bytes more than 1 rank"; exit 1; }
"$strata" ckpt info "$work/dp4" > "$work/info.txt"
"$strata" run -n 2 "$strategy" --out "$work/dp4" --resume "${common[@]}" --set job.steps=3 > "$work/resume.log" 2>&1 \
  || { cat "$work/resume.log"; exit 1; }
grep -q "resumed from .* at step 2 (saved by 4 ranks)" "$work/resume.log" || { cat "$work/resume.log"; exit 1; }
echo "OK"
