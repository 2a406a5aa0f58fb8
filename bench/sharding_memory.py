"""Model-state memory per rank under ddp, zero1, zero2 and fsdp at 1, 2 and 4 ranks, next to the
ZeRO paper's formulas for fp32 training with Adam.

usage: python bench/sharding_memory.py [--strata build/bin/strata] [--out bench/results/sharding_memory_cpu.md]

Each configuration is one `strata run -n N` (GPT, 8 layers, d_model 512, seq 128, synthetic
tokens, 3 steps, AdamW, 1 thread per rank). Strata reports, per step, the bytes each rank holds
in parameters, gradients and optimizer state (each storage counted once, taken just before the
optimizer step), its peak of live tensor bytes (the counting CPU allocator's) and its peak RSS, as the
maximum over ranks; the table takes the last step (the live-tensor peak: over the run). The
parameter count Ψ comes from the checkpoint (`strata ckpt info`), independently of those figures.
Formulas (bytes per rank): ddp 4Ψ + 4Ψ + 8Ψ; zero1 4Ψ + 4Ψ + 8Ψ/N; zero2 4Ψ + (4Ψ + 8Ψ)/N;
fsdp (4Ψ + 4Ψ + 8Ψ)/N.
"""
import argparse
import json
import pathlib
import os
import re
import subprocess
import tempfile

from machine import cpu_model

PASSES = ["ddp", "zero1", "zero2", "fsdp"]
RANKS = [1, 2, 4]
STRATEGY = """
[job]
model = "gpt"
dataset = "synthetic"
steps = 3
global_batch = 8
log_every = 100
eval_every = 0
checkpoint_every = 0
threads = 1
[model]
n_layer = 8
n_head = 8
d_model = 512
vocab_size = 256
seq_len = 128
[data]
vocab_size = 256
[[pass]]
name = "{name}"
"""


def formula(name, psi, n):
    params, grads, optimizer = 4 * psi, 4 * psi, 8 * psi
    if name == "zero1":
        optimizer /= n
    elif name == "zero2":
        grads, optimizer = grads / n, optimizer / n
    elif name == "fsdp":
        params, grads, optimizer = params / n, grads / n, optimizer / n
    return params, grads, optimizer


def run_strategy(strata, work, label, text, ranks):
    """Trains strategy `text` on `ranks` ranks; returns the run directory and its metrics records."""
    strategy = work / f"{label}.toml"
    strategy.write_text(text)
    out = work / f"{label}_{ranks}"
    subprocess.run([strata, "run", "-n", str(ranks), str(strategy), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run(strata, work, name, ranks):
    out, records = run_strategy(strata, work, name, STRATEGY.format(name=name), ranks)
    record = dict(records[-1])
    record["mem_device_peak_bytes"] = max(r["mem_device_peak_bytes"] for r in records)
    return out, record


def parameter_count(strata, run_dir):
    info = subprocess.run([strata, "ckpt", "info", str(run_dir)], check=True, capture_output=True, text=True).stdout
    return int(re.search(r"^  model: \d+ tensors, (\d+) elements$", info, re.M).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/sharding_memory_cpu.md")
    args = ap.parse_args()
    mib = 1024.0 * 1024.0
    rows, psi = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name in PASSES:
            for ranks in RANKS:
                out, record = run(args.strata, pathlib.Path(tmp), name, ranks)
                psi = psi or parameter_count(args.strata, out)
                want = formula(name, psi, ranks)
                got = (record["mem_params_bytes"], record["mem_grads_bytes"], record["mem_optimizer_bytes"])
                ratio = sum(got) / sum(want)
                rows.append(f"| {name} | {ranks} | {got[0] / mib:.2f} / {want[0] / mib:.2f} | {got[1] / mib:.2f} / {want[1] / mib:.2f} | "
                            f"{got[2] / mib:.2f} / {want[2] / mib:.2f} | {sum(got) / mib:.2f} | {sum(want) / mib:.2f} | {ratio:.3f} | "
                            f"{record['mem_device_peak_bytes'] / mib:.1f} | {record['mem_peak_bytes'] / mib:.0f} | {record['loss']:.6f} |")
                print(rows[-1], flush=True)
    lines = [f"# Model-state memory per rank under data-parallel sharding ({cpu_model()}, {os.cpu_count()} cores, fp32 AdamW)", "",
             "Command: `~/.local/share/strata/venv/bin/python bench/sharding_memory.py`.",
             f"GPT 8 layers, d_model 512, seq 128, Ψ = {psi} parameters (from `strata ckpt info`), global batch 8, 3 steps.",
             "Measured figures are Strata's `mem_*_bytes` metrics of the last step (maximum over ranks, each storage counted once,",
             "padding of flat units included); formulas are the ZeRO paper's for fp32 Adam: ddp 16Ψ, zero1 4Ψ+4Ψ+8Ψ/N,",
             "zero2 4Ψ+12Ψ/N, fsdp 16Ψ/N. Peak RSS is the whole process (libtorch, MPI, activations included).", "",
             "Peak live tensors is the counting CPU allocator's peak of live tensor bytes over the run (`mem_device_peak_bytes`):",
             "model states, activations and every transient buffer, without the process's own memory.", "",
             "| pass | ranks | params MiB measured / formula | grads MiB | optimizer MiB | model states MiB | formula MiB | ratio | peak live tensors MiB | peak RSS MiB | loss at step 3 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
