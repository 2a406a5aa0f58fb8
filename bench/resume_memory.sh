#!/usr/bin/env bash
# Memory of resuming a sharded checkpoint (issue 58, sharded loading): GPT-2 small (124M, the
# fsdp_bf16 example at seq 32) trained one step on 4 fsdp ranks and saved, then resumed on 4 ranks
# (same layout) and on 2 (resharded). Each rank's log records, right after the state is restored
# (core engine/resume.cpp), its resident set and peak, and both before the restore.
# usage: bash bench/resume_memory.sh [STRATA] [RESULTS]   (default build/bin/strata, bench/results/resume_memory_cpu.md)
set -euo pipefail
strata=${1:-build/bin/strata} results=${2:-bench/results/resume_memory_cpu.md}
out=$(mktemp -d /tmp/resume_memory.XXXXXX)
trap 'rm -rf "$out"' EXIT
common=(--set model.seq_len=32 --set job.threads=1 --set job.eval_every=0 --set job.checkpoint_every=1 --set job.global_batch=4)
"$strata" run -n 4 examples/strategies/fsdp_bf16.toml --out "$out/run" "${common[@]}" --set job.steps=1 > /dev/null 2>&1
size=$(du -sm "$out/run/checkpoints/step_00000001" | cut -f1)
rows=()
for n in 4 2; do
  rm -rf "$out/resume$n" && cp -r "$out/run" "$out/resume$n"
  "$strata" run -n "$n" examples/strategies/fsdp_bf16.toml --out "$out/resume$n" --resume "${common[@]}" --set job.steps=2 > /dev/null 2>&1
  while read -r resident peak before peak_before; do
    rows+=("| 4 -> $n | $before | $resident | $peak | $((peak - before)) |")
  done < <(grep -h "state restored" "$out/resume$n"/logs/rank_*.log |
           sed -E 's/.*resident ([0-9]+) MiB, peak ([0-9]+) MiB \(([0-9]+) MiB before the restore, peak ([0-9]+) MiB\)/\1 \2 \3 \4/')
  rm -rf "$out/resume$n"
done
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
{
  echo "# Resuming a sharded checkpoint: memory per rank (CPU)"
  echo
  echo "Command: \`bash bench/resume_memory.sh\`  "
  echo "Machine: $cpu, $(nproc) cores. Job: examples/strategies/fsdp_bf16.toml (GPT-2 small, 124M, amp bf16) at seq 32,"
  echo "saved after one step by 4 fsdp ranks (checkpoint $size MiB: fp32 weights and AdamW moments, 12 B per parameter),"
  echo "resumed on 4 ranks and on 2 (resharded). Figures from each rank's log line \`state restored from ...\`."
  echo
  echo "| ranks saved -> resumed | resident before MiB | resident after MiB | peak after MiB | peak above before MiB |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
} > "$results"
cat "$results"
