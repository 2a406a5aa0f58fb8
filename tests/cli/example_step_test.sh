#!/usr/bin/env bash
# Every example strategy plans and trains one step at the rank count its "# ranks: N" line names.
# Only what a step's cost depends on is shrunk (steps, batch, sequence length); the layout, the
# passes and the model's shape stay the example's. A data file the example names but the
# repository does not ship is replaced: text by data/kjv.txt, tokens by a small generated file.
#   example_step_test.sh STRATA EXAMPLE.toml WORK_DIR
set -euo pipefail
strata=$1 example=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
ranks=$(sed -n 's/^# ranks: \([0-9]*\).*/\1/p' "$example")
[ -n "$ranks" ] || { echo "FAIL: $example has no '# ranks: N' line"; exit 1; }

"$strata" plan -n "$ranks" "$example" > "$work/plan.txt" || { cat "$work/plan.txt"; echo "FAIL: plan"; exit 1; }
grep -q "^Step program" "$work/plan.txt" || { echo "FAIL: plan shows no step program"; exit 1; }

# Where is [data] path, and which dataset reads it?
dataset=$(sed -n 's/^dataset *= *"\(.*\)"/\1/p' "$example" | head -1)
path=$(awk '/^\[data\]/{d=1;next} /^\[/{d=0} d && /^path *=/{gsub(/.*= *"|".*/,""); print}' "$example")
sets=(--set job.steps=1 --set job.global_batch="$ranks" --set job.micro_batch=1 --set job.eval_every=1
      --set job.eval_batches=1 --set job.checkpoint_every=0 --set job.threads=1)
sets+=(--set model.seq_len=64)
if [ -n "$path" ] && [ ! -e "$path" ]; then
  case "$dataset" in
    text) sets+=(--set data.path=data/kjv.txt) ;;
    tokens)
      python3 - "$work/tokens.bin" <<'PY'
import random, struct, sys
random.seed(0)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<%dH" % 200000, *[random.randrange(256) for _ in range(200000)]))
PY
      sets+=(--set data.path="$work/tokens.bin") ;;
  esac
fi
"$strata" run -n "$ranks" "$example" --out "$work/run" "${sets[@]}" > "$work/run.txt" 2>&1 || { cat "$work/run.txt"; echo "FAIL: run"; exit 1; }
grep -q '"step":1' "$work/run/metrics.jsonl" || { cat "$work/run.txt"; echo "FAIL: no step 1 in metrics"; exit 1; }
echo "OK: $(basename "$example") planned and trained one step on $ranks rank(s)"
