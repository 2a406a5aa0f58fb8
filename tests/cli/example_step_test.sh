#!/usr/bin/env bash
# Every example strategy plans and trains one step at the rank count its "# ranks: N" line names.
# Only what a step's cost depends on is shrunk (steps, batch, sequence length); the layout, the
# passes, the model's shape and the data stay the example's.
#   example_step_test.sh STRATA EXAMPLE.toml WORK_DIR
set -euo pipefail
strata=$1 example=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
ranks=$(sed -n 's/^# ranks: \([0-9]*\).*/\1/p' "$example")
[ -n "$ranks" ] || { echo "FAIL: $example has no '# ranks: N' line"; exit 1; }

"$strata" plan -n "$ranks" "$example" > "$work/plan.txt" || { cat "$work/plan.txt"; echo "FAIL: plan"; exit 1; }
grep -q "^Step program" "$work/plan.txt" || { echo "FAIL: plan shows no step program"; exit 1; }

# The data as shipped: the file the example names must be there after scripts/setup (a user runs
# the example as it is), never replaced here.
path=$(awk '/^\[data\]/{d=1;next} /^\[/{d=0} d && /^path *=/{gsub(/^path *= *"|".*/,""); print}' "$example")
if [ -n "$path" ] && [ ! -e "$path" ]; then echo "FAIL: $example reads $path, which scripts/setup does not make"; exit 1; fi
sets=(--set job.steps=1 --set job.global_batch="$ranks" --set job.micro_batch=1 --set job.eval_every=1
      --set job.eval_batches=1 --set job.checkpoint_every=1 --set job.threads=1)
sets+=(--set model.seq_len=16)
"$strata" run -n "$ranks" "$example" --out "$work/run" "${sets[@]}" > "$work/run.txt" 2>&1 || { cat "$work/run.txt"; echo "FAIL: run"; exit 1; }
grep -q '"step":1' "$work/run/metrics.jsonl" || { cat "$work/run.txt"; echo "FAIL: no step 1 in metrics"; exit 1; }

# The run's saved strategy.toml is rerunnable as is: it plans again, resumes the run (to step 2)
# and its checkpoint exports. (A saved Mixtral strategy was once refused by strata itself, so
# neither --resume nor export worked for any Mixtral run.)
saved="$work/run/strategy.toml"
"$strata" plan -n "$ranks" "$saved" > "$work/plan_saved.txt" 2>&1 || { cat "$work/plan_saved.txt"; echo "FAIL: the saved strategy does not plan"; exit 1; }
"$strata" run -n "$ranks" "$saved" --out "$work/run" --resume --set job.steps=2 > "$work/resume.txt" 2>&1 ||
  { cat "$work/resume.txt"; echo "FAIL: resume with the saved strategy"; exit 1; }
grep -q '"step":2' "$work/run/metrics.jsonl" || { cat "$work/resume.txt"; echo "FAIL: no step 2 after the resume"; exit 1; }
"$strata" ckpt export "$work/run" "$work/export" > "$work/export.txt" 2>&1 || { cat "$work/export.txt"; echo "FAIL: export"; exit 1; }
[ -s "$work/export/model.safetensors" ] && [ -s "$work/export/config.json" ] || { echo "FAIL: export wrote no model"; exit 1; }
echo "OK: $(basename "$example") planned and trained one step on $ranks rank(s); its saved strategy planned, resumed and exported"
