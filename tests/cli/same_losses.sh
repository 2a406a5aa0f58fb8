#!/usr/bin/env bash
# same_losses.sh [--field NAME] [--after STEP] [--first K] [--differ] LABEL TOLERANCE MIN_STEPS A B
# The one comparison of two runs' per-step figures that the CLI tests share. A and B are run
# directories or metrics.jsonl files; their lines are paired in order and must name the same
# steps. Compares the field (default "loss") of the steps after STEP (default 0), the first K of
# them if given, by the relative difference |a - b| / |a|. Prints
#   LABEL: N steps, worst relative loss difference D (tolerance T)
# and fails if fewer than MIN_STEPS steps were compared or D > TOLERANCE (0 = bit for bit); with
# --differ it fails if D <= TOLERANCE instead (to show that an option changes training at all).
set -euo pipefail
field=loss after=0 first=0 mode=same
while [[ ${1:-} == --* ]]; do
  case $1 in
    --field) field=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --first) first=$2; shift 2 ;;
    --differ) mode=differ; shift ;;
    *) echo "same_losses.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -eq 5 ]] || { echo "usage: same_losses.sh [--field NAME] [--after STEP] [--first K] [--differ] LABEL TOLERANCE MIN_STEPS A B" >&2; exit 2; }
label=$1 tolerance=$2 min_steps=$3
metrics() { if [[ -d $1 ]]; then echo "$1/metrics.jsonl"; else echo "$1"; fi; }
column() { sed -E "s/.*\"step\":([0-9]+),.*\"$field\":([^,}]+).*/\\1 \\2/" "$(metrics "$1")"; }
paste -d ' ' <(column "$4") <(column "$5") | awk -v label="$label" -v field="$field" -v tol="$tolerance" -v min="$min_steps" \
  -v after="$after" -v first="$first" -v mode="$mode" '
  $1 != $3 { print label ": step mismatch: " $1 " vs " $3; exit 1 }
  $1 > after && (first == 0 || n < first) {
    d = $2 - $4; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2; rel = a > 0 ? d / a : d; if (rel > worst) worst = rel; n++ }
  END { printf "%s: %d steps, worst relative %s difference %.3e (tolerance %g)\n", label, n, (field == "grad_norm" ? "gradient norm" : field), worst, tol
        if (n < min) exit 1
        if (mode == "same" && worst > tol) exit 1
        if (mode == "differ" && worst <= tol) exit 1 }'
