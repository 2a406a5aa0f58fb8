#!/usr/bin/env bash
# amp_cpu_note_test.sh STRATA: `strata plan` of an amp strategy on the CPU says when this CPU has
# no native products for the chosen dtype (amp cannot be faster than fp32 there), and says nothing
# where it has them. What the CPU has is read from
# /proc/cpuinfo here, independently of Strata's own detection.
set -euo pipefail
strata=$1
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
plan=$(mktemp)
trap 'rm -f "$plan"' EXIT
for dtype in bf16 fp16; do
  "$strata" plan examples/strategies/fsdp_bf16.toml -n 2 --set "pass.amp.dtype=\"$dtype\"" > "$plan"
  if grep -qw "avx512_$dtype\|amx_$dtype" <<< "$flags"; then
    if grep -q "^amp: this CPU" "$plan"; then echo "FAIL: $dtype: a note although the CPU has native products"; exit 1; fi
    echo "OK: $dtype: native products, no note"
  else
    grep -q "^amp: this CPU has neither AVX512-${dtype^^} nor AMX-${dtype^^}, so it has no native $dtype products:$" "$plan" ||
      { cat "$plan"; echo "FAIL: $dtype: no note on a CPU without native products"; exit 1; }
    echo "OK: $dtype: no native products, noted"
  fi
done
