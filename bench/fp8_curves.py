"""fp8 training against bf16 and fp32 (issue 34): loss curves over 300 steps of the default GPT
and the Llama job for each fp8 recipe and format, and step time and peak memory side by side.

usage: python bench/fp8_curves.py [--strata build/bin/strata] [--steps 300] [--jobs gpt,llama]
                                  [--rounds 3] [--timing-steps 10] [--out bench/results/fp8_curves_cpu.md] [--append]

Variants (one process, the same data and seed; every fp8 variant under amp bf16, as fp8 runs in
practice: what is not an fp8 GEMM runs in bf16):
  fp32, bf16 (amp), fp8 delayed HYBRID, fp8 delayed E4M3, fp8 current HYBRID, fp8 rowwise HYBRID.
Curves: the runs go two at a time (one thread each; 2 cores), then `strata report` overlays them
in bench/results/fp8_curves_<job>.html. Tolerance figures compare each variant to bf16: the worst
relative difference of the 20-step moving averages of the training loss (single steps are
chaotic: any perturbation moves the loss as much as fp8 does, ../shared/specs/parallelism.md
section 5), and the final validation loss.
Timing: the variants in interleaved rounds, one at a time, 2 threads, each run's median step.
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import tempfile

EXAMPLES = pathlib.Path("examples/strategies")
JOBS = {"gpt": "default.toml", "llama": "llama_text.toml"}
AMP = '\n[[pass]]\nname = "amp"\ndtype = "bf16"\n'
VARIANTS = {  # name: passes appended to the job's example strategy
    "fp32": "",
    "bf16": AMP,
    "fp8 delayed HYBRID": AMP + '\n[[pass]]\nname = "fp8"\nrecipe = "delayed"\nfp8_format = "HYBRID"\n',
    "fp8 delayed E4M3": AMP + '\n[[pass]]\nname = "fp8"\nrecipe = "delayed"\nfp8_format = "E4M3"\n',
    "fp8 current HYBRID": AMP + '\n[[pass]]\nname = "fp8"\nrecipe = "current"\nfp8_format = "HYBRID"\n',
    "fp8 rowwise HYBRID": AMP + '\n[[pass]]\nname = "fp8"\nrecipe = "rowwise"\nfp8_format = "HYBRID"\n',
}
# Fewer tokens per step than the examples' 16 x 128: the CPU's bf16 GEMMs are slow.
SETS = {"job.global_batch": 8, "model.seq_len": 64, "job.eval_every": 100, "job.checkpoint_every": 0, "job.log_every": 50}
WINDOW = 20
WARMUP = 3


def command(binary, job, variant, steps, threads, out_dir):
    strategy = out_dir.parent / (out_dir.name + ".toml")
    strategy.write_text((EXAMPLES / JOBS[job]).read_text() + VARIANTS[variant])
    cmd = [binary, "run", str(strategy), "--out", str(out_dir)]
    if 'name = "ddp"' in strategy.read_text():
        cmd += ["--disable", "ddp"]
    for k, v in {**SETS, "job.steps": steps, "job.threads": threads}.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def records(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def moving_average(values, window):
    return [statistics.fmean(values[i - window + 1:i + 1]) for i in range(window - 1, len(values))]


def curves(args, job, work):
    """Runs every variant for args.steps steps, two at a time; returns {variant: run_dir}."""
    dirs = {v: work / f"{job}_{v.replace(' ', '_')}" for v in VARIANTS}
    pending = list(VARIANTS)
    while pending:
        batch, pending = pending[:2], pending[2:]
        procs = [subprocess.Popen(command(args.strata, job, v, args.steps, 1, dirs[v]), stdout=subprocess.DEVNULL) for v in batch]
        for p, v in zip(procs, batch):
            if p.wait() != 0:
                raise SystemExit(f"{job} {v} failed")
        print(job, "done:", ", ".join(batch), flush=True)
    return dirs


def compare(dirs):
    """Per variant: final train loss (mean of the last WINDOW steps), final validation loss, and
    the worst relative difference of the WINDOW-step moving averages from bf16's."""
    loss = {v: [r["loss"] for r in records(d) if "loss" in r] for v, d in dirs.items()}
    val = {v: [r["val_loss"] for r in records(d) if "val_loss" in r] for v, d in dirs.items()}
    base = moving_average(loss["bf16"], WINDOW)
    rows = {}
    for v in dirs:
        ma = moving_average(loss[v], WINDOW)
        worst = max(range(len(ma)), key=lambda i: abs(ma[i] - base[i]) / base[i])
        rows[v] = {"last": ma[-1], "val": val[v][-1], "val_bf16": val["bf16"][-1],
                   "worst": abs(ma[worst] - base[worst]) / base[worst], "worst_step": worst + WINDOW}
    return rows


def timing(args, job, work):
    runs = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            out = work / f"time_{job}_{r}_{v.replace(' ', '_')}"
            subprocess.run(command(args.strata, job, v, args.timing_steps, 2, out) + ["--set", "job.eval_every=0"],
                           check=True, stdout=subprocess.DEVNULL)
            rec = records(out)
            runs[v].append((statistics.median(x["step_ms"] for x in rec[WARMUP:]), rec[-1]["mem_peak_bytes"]))
    return {v: (statistics.median(ms for ms, _ in x), max(p for _, p in x)) for v, x in runs.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--jobs", default="gpt,llama")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timing-steps", type=int, default=10)
    parser.add_argument("--out", default="bench/results/fp8_curves_cpu.md")
    parser.add_argument("--append", action="store_true", help="add these jobs' sections to --out")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for job in args.jobs.split(","):
            dirs = curves(args, job, work)
            report = pathlib.Path(args.out).with_name(f"fp8_curves_{job}.html")
            subprocess.run([args.strata, "report", *map(str, dirs.values()), "-o", str(report)], check=True, stdout=subprocess.DEVNULL)
            results[job] = (compare(dirs), timing(args, job, work))
            print(job, json.dumps(results[job], default=str), flush=True)

    with open(args.out, "a" if args.append else "w") as f:
        if not args.append:
            f.write("# fp8 vs bf16 vs fp32: loss curves, step time, memory (CPU)\n\n")
            f.write(f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared, noisy). Jobs: examples/strategies/"
                    f"{{default,llama_text}}.toml on one process with global_batch 8, seq_len 64; every fp8 variant under amp "
                    f"bf16. Curves overlaid by `strata report`: bench/results/fp8_curves_<job>.html.\n\n")
            f.write(f"Loss against bf16: `MA{WINDOW} worst` is the largest relative difference between the {WINDOW}-step "
                    f"moving averages of the training loss (at the step named), `train` the last {WINDOW} steps' mean, `val` "
                    f"the validation loss at the last step (8 batches). Step ms: the median of {args.rounds} interleaved "
                    f"rounds of each run's median step (steps {WARMUP + 1}..{args.timing_steps}, 2 threads).\n\n")
            f.write("Bytes a Linear [out x in] keeps for backward per token of input, besides its weight: fp32 4 x in; amp "
                    "bf16 2 x in (autocast's bf16 copy); fp8 delayed/current 1 x in (the fp8 input, plus the fp8 weight, "
                    "out x in bytes); fp8 rowwise 2 x in under amp (the bf16 input, re-quantized per GEMM). Peak MiB is the "
                    "process's mem_peak_bytes, dominated at this size by libtorch itself (about 380 MiB), so these small "
                    "models show the formula's differences only faintly.\n\n")
            f.write("Expected on an H100 (../shared/specs/parallelism.md section 5, not measured here: no GPU in this task): "
                    "torchtitan's Llama-3.1-8B on 8 H100 goes from 6,667 to 8,532 tokens/s/GPU with fp8 (+28%); small GEMMs "
                    "can be slower in fp8 (0.8x at 1024x2048x1024). On this CPU `_scaled_mm` is a reference implementation "
                    "and fp8 is no speed-up over fp32; it beats amp bf16 only because the CPU's bf16 GEMMs are slower still.\n\n")
        for job, (rows, times) in results.items():
            f.write(f"## {job}\n\nCommand: `~/.local/share/strata/venv/bin/python bench/fp8_curves.py --steps {args.steps} "
                    f"--jobs {args.jobs} --rounds {args.rounds} --timing-steps {args.timing_steps}"
                    f"{' --append' if args.append else ''}`\n\n")
            f.write(f"| variant | train (last {WINDOW}) | val | val vs bf16 | MA{WINDOW} worst vs bf16 | at step "
                    "| step ms | vs bf16 | vs fp32 | peak MiB |\n|---|---|---|---|---|---|---|---|---|---|\n")
            for v, r in rows.items():
                ms, peak = times[v]
                f.write(f"| {v} | {r['last']:.4f} | {r['val']:.4f} | {(r['val'] - r['val_bf16']) / r['val_bf16']:+.2%} | "
                        f"{r['worst']:.2%} | {r['worst_step']} | {ms:.1f} | {ms / times['bf16'][0]:.2f} | "
                        f"{ms / times['fp32'][0]:.2f} | {peak / 2**20:.0f} |\n")
            f.write("\n")
    print(open(args.out).read())


if __name__ == "__main__":
    main()
