#!/usr/bin/env bash
# consolidate_test.sh STRATA PYTHON STRATEGY WORKDIR
# Trains the same 12 steps in one process, with fsdp on 4 ranks and with zero2 on 2 ranks,
# consolidates each final checkpoint with `strata ckpt consolidate`, and requires the three files
# to hold the same names with the same whole shapes, and the same values (within the drift
# data-parallel sums cause), for the model and the optimizer state. An output path under a file
# is one line and exit status 2.
set -euo pipefail
strata=$1 python=$2 strategy=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
run() {
  local name=$1 ranks=$2
  shift 2
  "$strata" run -n "$ranks" "$strategy" --out "$work/$name" --disable ddp "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  "$strata" ckpt consolidate "$work/$name" "$work/$name.safetensors"
  "$strata" ckpt info "$work/$name" > "$work/$name.info"
}
run single 1
run fsdp4 4 --set pass.fsdp.enabled=true
run zero2_2 2 --set pass.zero2.enabled=true
grep -q "sliced over rank(s) 0,1,2,3" "$work/fsdp4.info"
grep -q "saved by 4 rank(s)" "$work/fsdp4.info"
"$python" - "$work" <<'PY'
import sys
from safetensors.torch import load_file
import torch
work = sys.argv[1]
ref = load_file(f"{work}/single.safetensors")
for other in ("fsdp4", "zero2_2"):
    got = load_file(f"{work}/{other}.safetensors")
    assert set(got) == set(ref), f"{other}: names differ: {sorted(set(got) ^ set(ref))[:5]}"
    worst = 0.0
    for name, t in ref.items():
        assert got[name].shape == t.shape and got[name].dtype == t.dtype, f"{other}: {name} {got[name].shape} vs {t.shape}"
        if name.startswith(("model/", "optimizer/")) and t.is_floating_point():
            scale = t.abs().max().item() or 1.0
            worst = max(worst, (got[name] - t).abs().max().item() / scale)
    print(f"{other}: {len(got)} tensors match the single-process checkpoint, worst relative difference {worst:.2e}")
    assert worst < 1e-3, f"{other}: values differ by {worst}"
PY
# An output path under a file: one line naming it, exit status 2, not an internal error (export
# and consolidate both create their output's directory).
for command in "export $work/single $work/single.info/hf" "consolidate $work/single $work/single.info/x.safetensors"; do
  set +e
  # shellcheck disable=SC2086
  "$strata" ckpt $command > "$work/bad_out.txt" 2>&1
  status=$?
  set -e
  [[ $status == 2 && $(wc -l < "$work/bad_out.txt") == 1 ]] &&
    grep -q "^strata: error: cannot create directories: Not a directory \[$work/single.info" "$work/bad_out.txt" ||
    { echo "ckpt $command: exit $status, not one line naming the path:"; cat "$work/bad_out.txt"; exit 1; }
done
echo "an output path under a file is refused in one line"
