#!/usr/bin/env bash
# pipeline_builds_alone_test.sh STRATA WORKDIR
# A pipeline rank builds only its stage's blocks (Pass::blocks_to_build): each rank's log says
# how many of the model's blocks it holds right after the build; a balanced partition, which
# measures every block, still builds them all.
set -euo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
common=(--set job.steps=1 --set job.global_batch=2 --set job.threads=1 --set job.eval_every=0 --set job.checkpoint_every=0
        --set model.n_layer=2 --set model.d_model=32 --set model.seq_len=32 --set parallel.pipeline=2)
"$strata" run -n 2 examples/strategies/pipeline_parallel.toml --out "$work/alone" "${common[@]}" > /dev/null
grep -q "model built: .* (2 of 4 blocks, chosen by pipeline_parallel)" "$work/alone/logs/rank_0.log"
grep -q "model built: .* (2 of 4 blocks, chosen by pipeline_parallel)" "$work/alone/logs/rank_1.log"
"$strata" run -n 2 examples/strategies/pipeline_parallel.toml --out "$work/whole" "${common[@]}" \
  --set pass.pipeline_parallel.partition=balanced > /dev/null
grep -q "model built: .* (every block)" "$work/whole/logs/rank_1.log"
echo "pipeline ranks built 2 of 4 blocks each; balanced built every block"
