"""Step time of two Strata builds side by side: did a change to the core slow training down?

usage: python bench/core_overhead.py --old OLD/bin/strata [--new build/bin/strata] [--steps 40]
                                     [--repeats 3] [--out bench/results/core_overhead_cpu.md]

Runs the same jobs with both binaries, alternating old and new `--repeats` times so that drift
of the machine hits both alike, and reports for each job the median step time of the steps after
warmup (median over steps, then median over repeats) and the ratio new / old. Jobs: the default
strategy (examples/strategies/default.toml, 2 ranks, ddp) and the model of bench/ddp_step_time.py
(4 layers, d_model 256, seq 128, vocab 4096, global batch 16, 4 MiB buckets, 2 ranks).
"""
import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import tempfile

WARMUP = 5
JOBS = [
    ("default job (default.toml, 2 ranks, ddp)", []),
    ("ddp_step_time model (d_model 256, vocab 4096, 2 ranks, ddp 4 MiB buckets)",
     ["--set", "model.d_model=256", "--set", "model.n_head=4", "--set", "model.vocab_size=4096",
      "--set", "job.global_batch=16", "--set", "pass.ddp.bucket_mb=4"]),
]


def run(strata, extra, steps, out):
    cmd = [strata, "run", "-n", "2", "examples/strategies/default.toml", "--out", str(out),
           "--set", f"job.steps={steps}", "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0",
           "--set", "job.threads=1", "--set", "job.log_every=1000"] + extra
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    times = [json.loads(line)["step_ms"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(times[WARMUP:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/core_overhead_cpu.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for j, (name, extra) in enumerate(JOBS):
            old, new = [], []
            for r in range(args.repeats):  # a run directory per run: another job's is refused as a different run
                old.append(run(args.old, extra, args.steps, pathlib.Path(tmp) / f"job{j}-old{r}"))
                new.append(run(args.new, extra, args.steps, pathlib.Path(tmp) / f"job{j}-new{r}"))
            rows.append((name, statistics.median(old), statistics.median(new), old, new))
    command = "python bench/core_overhead.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k != "out") + f" --out {args.out}"
    lines = ["# Step time of two Strata builds side by side, CPU", "",
             f"Command: `{command}`  ",
             f"Machine: {platform.machine()}, 2 ranks with 1 thread each; median step time of steps "
             f"{WARMUP + 1}..{args.steps}, then median over {args.repeats} alternating repeats.", "",
             "| job | old ms/step | new ms/step | new / old | old repeats | new repeats |", "|---|---|---|---|---|---|"]
    for name, old, new, olds, news in rows:
        lines.append(f"| {name} | {old:.2f} | {new:.2f} | {new / old:.3f} | "
                     f"{', '.join(f'{x:.1f}' for x in olds)} | {', '.join(f'{x:.1f}' for x in news)} |")
    text = "\n".join(lines) + "\n"
    pathlib.Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
