"""Where the default job's step time goes, per operator: Strata's own profile ([job]
profile_steps) next to torch.profiler's of the same model in PyTorch eager, before choosing what
to fuse (issue 19).

usage: python bench/profile_default.py [--strata build/bin/strata] [--steps 10] [--top 25]
                                       [--out bench/results/profile_default_cpu.md]

Strata trains examples/strategies/default.toml as `scripts/main` does but on one rank with one
thread (the per-rank share of the 2-rank job: batch 8 of the global 16), profiling --steps steps
after 2 warm-up steps. PyTorch eager runs bench/step_time.py's GPT-2 at the same sizes (vocab
256, seq 128, d_model 128, 4 layers, batch 8), one thread, AdamW and clipping as Strata.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import step_time  # noqa: E402  (the PyTorch eager GPT-2 of the step-time benchmark)

VOCAB, SEQ, D, LAYERS, HEADS, BATCH = 256, 128, 128, 4, 4, 8


def strata_profile(strata, steps):
    with tempfile.TemporaryDirectory() as out:
        cmd = [strata, "run", "examples/strategies/default.toml", "--out", out, "--disable", "ddp",
               "--set", f"job.steps={steps + 2}", "--set", f"job.profile_steps={steps}", "--set", "job.threads=1",
               "--set", "job.global_batch=8", "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0",
               "--set", f"job.log_every={steps + 2}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return (pathlib.Path(out) / "profile_rank0.md").read_text(), " ".join(cmd[1:]).replace(out, "OUT")


def pytorch_profile(steps):
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    step_time.VOCAB = VOCAB
    torch.manual_seed(0)
    model = step_time.Gpt(LAYERS, HEADS, D, SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    data = torch.randint(VOCAB, (steps + 2, BATCH, SEQ + 1))

    def step(s):
        step_time.eager_step(model, opt, data[s])

    for s in range(2):
        step(s)
    import time
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for s in range(2, steps + 2):
            step(s)
        wall = (time.perf_counter() - start) * 1000 / steps
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return wall, [(e.key, e.count / steps, e.self_cpu_time_total / 1000 / steps) for e in rows]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default="bench/results/profile_default_cpu.md")
    args = parser.parse_args()

    strata_table, strata_cmd = strata_profile(args.strata, args.steps)
    wall, rows = pytorch_profile(args.steps)
    lines = strata_table.splitlines()
    header = [l for l in lines if not l.startswith("|")]
    table = [l for l in lines if l.startswith("|")][: args.top + 2]
    with open(args.out, "w") as f:
        f.write("# Operator profile of the default job (CPU, fp32, one rank's share, one thread)\n\n")
        f.write(f"Command: `~/.local/share/strata/venv/bin/python bench/profile_default.py --steps {args.steps} --top {args.top}`  \n")
        f.write(f"Strata run by it: `strata {strata_cmd}`; torch {torch.__version__}, {os.cpu_count()} cores.\n\n")
        f.write("## Strata ([job] profile_steps)\n\n")
        f.write("\n".join(h for h in header[1:] if h.strip()) + "\n\n")
        f.write("\n".join(table) + "\n\n")
        f.write(f"## PyTorch eager, same model and batch (torch.profiler, self CPU)\n\n{wall:.2f} ms per step (wall, profiled).\n\n")
        f.write("| operator | calls/step | self ms/step | share of step |\n|---|---|---|---|\n")
        for key, calls, ms in rows[: args.top]:
            f.write(f"| {key} | {calls:.1f} | {ms:.3f} | {100 * ms / wall:.1f}% |\n")
    print(open(args.out).read())


if __name__ == "__main__":
    main()
