#!/usr/bin/env bash
# transformers_parity.sh UNIT_TESTS PYTHON WORKDIR: Strata writes tiny GPT, Llama and Mixtral models in
# Hugging Face layout with their logits; transformers loads them and must give the same logits.
set -euo pipefail
unit_tests=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
STRATA_HF_EXPORT_DIR=$work "$unit_tests" --gtest_filter=Interchange.WritesFilesForTransformers
"$python" "$(dirname "$0")/transformers_parity.py" "$work"
