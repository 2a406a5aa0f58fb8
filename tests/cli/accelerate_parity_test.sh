#!/usr/bin/env bash
# accelerate_parity_test.sh PROGRAM STRATEGY WORKDIR MPIRUN [MPIRUN FLAGS...]
# A program's own model trained through the library API (sdk/examples/mlp_lm): one process with
# no passes against tensor parallel on 2 and 3 ranks and ddp on 3 ranks, each under mpirun (every
# rank runs the program); every
# step's loss must agree within a relative 2e-6.
set -euo pipefail
program=$1 strategy=$2 work=$3
shift 3
mpirun=("$@")
rm -rf "$work" && mkdir -p "$work"
one_process=(parallel.tensor=1 pass.tensor_parallel.enabled=false)
run() {  # NAME RANKS SETTINGS...
  local name=$1 ranks=$2
  shift 2
  local launch=()
  ((ranks > 1)) && launch=("${mpirun[@]}" -np "$ranks")
  (cd "$work" && "${launch[@]}" "$program" "$strategy" job.run_dir="$work/$name" job.steps=12 "$@" > "$work/$name.log" 2>&1) ||
    { cat "$work/$name.log"; exit 1; }
}
losses() { sed -E 's/.*"loss":([^,]+),.*/\1/' "$work/$1/metrics.jsonl"; }
compare() {  # BASELINE RUN
  paste <(losses "$1") <(losses "$2") | awk -v name="$2" '
    { d = $1 - $2; if (d < 0) d = -d; rel = d / $1; if (rel > worst) worst = rel; n++ }
    END { printf "%s: %d steps, worst relative loss difference %.2e\n", name, n, worst; if (n < 12 || worst > 2e-6) exit 1 }'
}
run baseline 1 "${one_process[@]}"
run tensor2 2
run tensor3 3 parallel.tensor=3 model.width=24
run baseline_width24 1 "${one_process[@]}" model.width=24
run baseline_batch6 1 "${one_process[@]}" job.global_batch=6
run ddp3 3 "${one_process[@]}" parallel.data=3 pass.ddp.enabled=true job.global_batch=6
compare baseline tensor2
compare baseline_width24 tensor3
compare baseline_batch6 ddp3
