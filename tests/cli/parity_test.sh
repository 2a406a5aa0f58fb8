#!/usr/bin/env bash
# parity_test.sh STRATA STRATEGY WORKDIR [EXTRA --set ...]
# The single-process fp32 baseline (no passes) against the ddp strategy at 1, 2 and 4 ranks
# (oversubscribed on small machines): every step's loss must agree within a relative 1e-5
# (observed: about 1e-7, from the different order of floating-point sums).
set -euo pipefail
strata=$1 strategy=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" --out "$work/baseline" --disable ddp "$@" > /dev/null
losses() { sed -E 's/.*"loss":([^,]+),.*/\1/' "$1/metrics.jsonl"; }
for ranks in 1 2 4; do
  "$strata" run -n "$ranks" "$strategy" --out "$work/ddp$ranks" "$@" > "$work/ddp$ranks.log" 2>&1 || { cat "$work/ddp$ranks.log"; exit 1; }
  paste <(losses "$work/baseline") <(losses "$work/ddp$ranks") | awk -v r="$ranks" '
    { d = $1 - $2; if (d < 0) d = -d; rel = d / $1; if (rel > worst) worst = rel; n++ }
    END { printf "ddp on %d ranks: %d steps, worst relative loss difference %.2e\n", r, n, worst;
          if (n < 10 || worst > 1e-5) exit 1 }'
done
