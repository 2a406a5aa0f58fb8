"""Peak memory and step time of training with and without the act_checkpoint pass.

usage: python bench/act_checkpoint_memory.py [--strata build/bin/strata] [--out bench/results/act_checkpoint_cpu.md]

Each configuration is a separate `strata run` process (GPT, d_model 256, 4 heads, seq 256,
batch 16, synthetic tokens, 4 steps, 2 threads) whose peak resident set size is read from the
kernel (wait4's ru_maxrss), so it includes libtorch, weights and optimizer state; the difference
between the two runs of a depth is the activation memory that checkpointing saved.
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import tempfile

DEPTHS = [4, 8, 16]
STRATEGY = """
[job]
model = "gpt"
dataset = "synthetic"
steps = 4
global_batch = 16
log_every = 100
eval_every = 0
checkpoint_every = 0
threads = 2
[model]
n_layer = {depth}
n_head = 4
d_model = 256
vocab_size = 256
seq_len = 256
[data]
vocab_size = 256
[[pass]]
name = "act_checkpoint"
enabled = {enabled}
"""


def run(strata, work, depth, enabled):
    strategy = work / f"d{depth}_{enabled}.toml"
    strategy.write_text(STRATEGY.format(depth=depth, enabled=str(enabled).lower()))
    out = work / f"run_d{depth}_{enabled}"
    proc = subprocess.Popen([strata, "run", str(strategy), "--out", str(out)], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"strata run failed for depth {depth}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return usage.ru_maxrss / 1024.0, statistics.median(r["step_ms"] for r in records[1:]), records[-1]["loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/act_checkpoint_cpu.md")
    args = ap.parse_args()
    lines = [f"# Activation checkpointing on CPU ({platform.machine()}, 2 threads, fp32)", "",
             "Command: `~/.local/share/strata/venv/bin/python bench/act_checkpoint_memory.py`.",
             "GPT d_model 256, 4 heads, seq 256, batch 16, synthetic tokens, 4 steps; peak RSS of the whole process.", "",
             "| layers | peak RSS without (MiB) | peak RSS with (MiB) | saved (MiB) | saved per layer (MiB) | ms/step without | ms/step with | time ratio | same final loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for depth in DEPTHS:
            off = run(args.strata, pathlib.Path(tmp), depth, False)
            on = run(args.strata, pathlib.Path(tmp), depth, True)
            saved = off[0] - on[0]
            lines.append(f"| {depth} | {off[0]:.0f} | {on[0]:.0f} | {saved:.0f} | {saved / depth:.1f} | {off[1]:.0f} | {on[1]:.0f} | "
                         f"{on[1] / off[1]:.2f} | {'yes' if off[2] == on[2] else 'no'} |")
            print(lines[-1], flush=True)
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
