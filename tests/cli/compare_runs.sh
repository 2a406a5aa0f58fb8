#!/usr/bin/env bash
# compare_runs.sh STRATA WORKDIR MODE TOLERANCE -- RUN_A_ARGS... -- RUN_B_ARGS...
# Runs `strata run` twice (each with its own --out) and compares the per-step losses in
# metrics.jsonl. MODE "same": every step's relative difference must be <= TOLERANCE (0 = bit
# for bit). MODE "differ": the trajectories must differ by more than TOLERANCE somewhere (to show
# that an option changes training at all). With B_METRICS_MATCH set, every line of run B's
# metrics.jsonl must also match that extended regex (to show that B really used its option);
# with B_LOG_MATCH set, every rank log of run B must hold a line matching that one.
# With GRAD_NORM_STEPS=K, the gradient norms of the first K steps are compared as the losses are.
# With SAME_FIELDS="NAME...", those figures must be equal in every step (tolerance 0).
# With B_LAUNCHER set (a command, e.g. "torchrun --nproc-per-node 2 --no-python"), run B is
# started by it instead of directly. With CONCURRENT set, both runs (single-process, no launcher)
# start at once with one thread each.
set -euo pipefail
strata=$1 work=$2 mode=$3 tolerance=$4
shift 4
[[ $1 == -- ]] || { echo "usage: compare_runs.sh STRATA WORKDIR MODE TOL -- A... -- B..." >&2; exit 2; }
shift
a=() b=()
while [[ $# -gt 0 && $1 != -- ]]; do a+=("$1"); shift; done
shift
b=("$@")
rm -rf "$work" && mkdir -p "$work"
if [[ -n ${CONCURRENT:-} ]]; then
  # Two single-process runs at once, one thread each: the test holds both cores (PROCESSORS 2)
  # and two one-thread runs keep them busier than two two-thread runs in turn.
  "$strata" run "${a[@]}" --set job.threads=1 --out "$work/a" > "$work/a.log" 2>&1 & run_a=$!
  "$strata" run "${b[@]}" --set job.threads=1 --out "$work/b" > "$work/b.log" 2>&1 & run_b=$!
  wait "$run_a" || { cat "$work/a.log"; wait "$run_b"; exit 1; }
  wait "$run_b" || { cat "$work/b.log"; exit 1; }
else
  "$strata" run "${a[@]}" --out "$work/a" > "$work/a.log" 2>&1 || { cat "$work/a.log"; exit 1; }
  read -ra launcher <<< "${B_LAUNCHER:-}"
  # torchrun's agent keeps its logs in a fresh TMPDIR/torchelastic_* directory: the test's own.
  mkdir -p "$work/tmp"
  TMPDIR="$work/tmp" "${launcher[@]}" "$strata" run "${b[@]}" --out "$work/b" > "$work/b.log" 2>&1 || { cat "$work/b.log"; exit 1; }
fi
# Every step's object names each figure once (a stage that runs twice in a step, as under WSAM,
# must not write a key twice: JSON readers would keep only one of them).
for run in "$work/a" "$work/b"; do
  awk -F'"' '{ delete seen; for (i = 2; i < NF; i += 2) if (substr($(i + 1), 1, 1) == ":" && seen[$i]++) { print FILENAME ":" NR ": \"" $i "\" twice"; bad = 1 } }
             END { exit bad }' "$run/metrics.jsonl"
done
same=$(dirname "$0")/same_losses.sh
differ=()
[[ $mode == differ ]] && differ=(--differ)
"$same" "${differ[@]}" "A vs B ($mode)" "$tolerance" 5 "$work/a" "$work/b"
if [[ -n ${GRAD_NORM_STEPS:-} ]]; then
  "$same" --field grad_norm --first "$GRAD_NORM_STEPS" "A vs B" "$tolerance" 1 "$work/a" "$work/b"
fi
for field in ${SAME_FIELDS:-}; do  # figures that must be equal in every step (counts over the whole batch)
  "$same" --field "$field" "A vs B" 0 1 "$work/a" "$work/b"
done
if [[ -n ${B_METRICS_MATCH:-} ]]; then
  bad=$(grep -cvE -- "$B_METRICS_MATCH" "$work/b/metrics.jsonl" || true)
  [[ $bad == 0 ]] || { echo "$bad lines of run B's metrics.jsonl do not match $B_METRICS_MATCH"; exit 1; }
fi
if [[ -n ${B_LOG_MATCH:-} ]]; then
  for log in "$work"/b/logs/rank_*.log; do
    grep -qE -- "$B_LOG_MATCH" "$log" || { echo "$log has no line matching $B_LOG_MATCH"; exit 1; }
  done
fi
