#!/usr/bin/env bash
# parity_test.sh STRATA STRATEGY WORKDIR [--pass NAME] [EXTRA --set ...]
# The single-process fp32 baseline (no passes) against the data-parallel pass NAME (default ddp;
# zero1, zero2 and fsdp are listed disabled in the strategy and switched on in place of ddp) at
# 1, 2 and 4 ranks (oversubscribed on small machines): every step's loss must agree within a
# relative 1e-5 (observed: about 1e-7, from the different order of floating-point sums; PARITY_TOL
# overrides it for reduced precision).
set -euo pipefail
strata=$1 strategy=$2 work=$3
shift 3
pass=ddp
if [[ ${1:-} == --pass ]]; then pass=$2; shift 2; fi
select=()
[[ $pass == ddp ]] || select=(--disable ddp --set "pass.$pass.enabled=true")
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" --out "$work/baseline" --disable ddp "$@" > /dev/null
for ranks in 1 2 4; do
  "$strata" run -n "$ranks" "$strategy" --out "$work/$pass$ranks" "${select[@]}" "$@" > "$work/$pass$ranks.log" 2>&1 ||
    { cat "$work/$pass$ranks.log"; exit 1; }
  "$(dirname "$0")/same_losses.sh" "$pass on $ranks ranks" "${PARITY_TOL:-1e-5}" 10 "$work/baseline" "$work/$pass$ranks"
done
