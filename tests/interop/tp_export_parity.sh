#!/usr/bin/env bash
# tp_export_parity.sh STRATA PYTHON STRATEGY WORKDIR RANKS TENSOR [--set ...]: trains STRATEGY at
# tensor 1 and at tensor TENSOR on RANKS ranks (same seed and data; further arguments go to both
# runs), exports both checkpoints with `strata ckpt export` (the split one also with --dtype bf16),
# and has transformers load them (tp_export_parity.py says what is compared).
set -euo pipefail
strata=$1 python=$2 strategy=$3 work=$4 ranks=$5 tensor=$6
shift 6
rm -rf "$work" && mkdir -p "$work"
# micro_batch given: the script recomputes the validation batches from it.
common=(--set job.global_batch=4 --set job.micro_batch=4 "$@")
"$strata" run "$strategy" --out "$work/whole" --set parallel.tensor=1 "${common[@]}" > /dev/null
"$strata" run "$strategy" -n "$ranks" --out "$work/split" --set "parallel.tensor=$tensor" "${common[@]}" > /dev/null
"$strata" ckpt export "$work/whole" "$work/whole_hf" > /dev/null
"$strata" ckpt export "$work/split" "$work/split_hf" > /dev/null
"$strata" ckpt export "$work/split" "$work/split_bf16_hf" --dtype bf16 > /dev/null
"$python" "$(dirname "$0")/tp_export_parity.py" "$work/whole_hf" "$work/split_hf" "$work/split" "$work/split_bf16_hf"
