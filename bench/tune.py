"""strata tune against exhaustive measurement (issue 35).

usage: python bench/tune.py [--strata build/bin/strata] [--ranks 4] [--out bench/results/tune_cpu.md]
                            [--exhaustive-runs 1] [--set section.key=value]...

1. Exhaustive: `strata tune -n R --top 65536 --rounds 1` measures every candidate that plans once
   (fresh cache), in one run: each candidate's measured step time and peak memory.
2. Tune as a user runs it: `strata tune -n R` (defaults, fresh cache), timed.
3. Confirmation: one trial of 4 steps on shared cores varies by tens of percent, and the minimum of
   many noisy trials is biased low, so the exhaustive run's 5 fastest and tune's choice are trained
   again, --confirm rounds each, interleaved, with the trial's settings; their medians decide the
   best and the ratio of tune's choice to it.
4. Figures: that ratio (and the same from the single exhaustive trials), tune's wall time over the
   exhaustive's, the cost model's predicted peak memory against measured for every candidate, and
   the Spearman rank correlation of predicted against measured step time.
   With --exhaustive-runs N > 1 the exhaustive measurement is repeated N times (fresh caches) and
   each candidate's measured time is the median of its N trials; the table also gives the
   Spearman correlation of run 1's measurements with run 2's (test-retest: how far the
   measurements themselves agree, the ceiling for any prediction).
The strategy is the single-process example at a size where a step does some work (d_model 256,
4 layers, global batch 4, micro_batch 1, one thread per rank); --set changes it.
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import tempfile
import time

BASE = "examples/strategies/single_process.toml"
SETS = ["data.path=data/kjv.txt", "job.threads=1", "job.global_batch=4", "job.micro_batch=1",
        "model.d_model=256", "model.n_layer=4", "model.n_head=4"]


def tune(strata, ranks, sets, out, top, cache):
    cmd = [strata, "tune", BASE, "-n", str(ranks), "--out", str(out)] + (["--top", str(top), "--rounds", "1"] if top else [])
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    start = time.monotonic()
    text = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    wall = time.monotonic() - start
    records = [json.loads(line) for line in open(out / "tune.jsonl")]
    return cmd, wall, text, records


def ranks_of(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):  # average ranks of ties
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks_of(a), ranks_of(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def key(record):
    return (record["layout"], tuple(record["choices"]))


def trial(strata, strategy, ranks, run_dir):
    """One trial as strata tune runs it (tune_trial.cpp): 2 warm-up + 4 measured steps, median step."""
    cmd = [strata, "run", str(strategy), "-n", str(ranks), "--out", str(run_dir), "--overwrite",
           "--set", "job.steps=6", "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0",
           "--set", "job.flash_every=0", "--set", "job.max_restarts=0", "--set", "job.log_every=1000"]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    steps = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return statistics.median(r["step_ms"] for r in steps if r["step"] > 2) / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", default="bench/results/tune_cpu.md")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--confirm", type=int, default=5, help="interleaved rounds of each finalist")
    ap.add_argument("--exhaustive-runs", type=int, default=1, help="exhaustive measurements; each candidate's median is used")
    args = ap.parse_args()
    sets = SETS + args.set
    work = pathlib.Path(tempfile.mkdtemp(prefix="strata_tune_bench_"))
    ex_cmd, ex_wall, _, exhaustive = tune(args.strata, args.ranks, sets, work / "exhaustive", 65536, work / "cache1")
    repeats = [tune(args.strata, args.ranks, sets, work / f"exhaustive{i}", 65536, work / f"cache1_{i}")[3]
               for i in range(2, args.exhaustive_runs + 1)]
    tu_cmd, tu_wall, tu_text, tuned = tune(args.strata, args.ranks, sets, work / "tune", 0, work / "cache2")

    # Each candidate's trials over the exhaustive runs; its measured time is their median.
    trials = {key(r): [r["measured_s"]] for r in exhaustive if "measured_s" in r}
    for records in repeats:
        for r in records:
            if "measured_s" in r and key(r) in trials:
                trials[key(r)].append(r["measured_s"])
    retest = None
    if repeats:
        both = [k for k, v in trials.items() if len(v) >= 2]
        retest = (spearman([trials[k][0] for k in both], [trials[k][1] for k in both]), len(both))
    single_rho = spearman([r["predicted_s"] for r in exhaustive if "measured_s" in r],
                          [r["measured_s"] for r in exhaustive if "measured_s" in r])
    for r in exhaustive:
        if "measured_s" in r:
            r["measured_s"] = statistics.median(trials[key(r)])

    measured = [r for r in exhaustive if "measured_s" in r]
    failed = [r for r in exhaustive if r["verdict"].startswith("failed")]
    best = min(measured, key=lambda r: r["measured_s"])
    choice = next(r for r in tuned if r["verdict"].startswith("best"))
    choice_in_exhaustive = next(r for r in measured if key(r) == key(choice))

    # Confirmation: the 5 fastest of the exhaustive run and tune's choice, interleaved rounds.
    finalists = sorted(measured, key=lambda r: r["measured_s"])[:5]
    if all(key(f) != key(choice) for f in finalists):
        finalists.append(choice_in_exhaustive)
    files = {key(f): work / "exhaustive" / f"candidate-{f['predicted_rank']}.toml" for f in finalists}
    confirmed = {key(f): [] for f in finalists}
    for round_ in range(args.confirm):
        for f in finalists:
            confirmed[key(f)].append(trial(args.strata, files[key(f)], args.ranks, work / "confirm"))
    median_of = {k: statistics.median(v) for k, v in confirmed.items()}
    best_confirmed = min(finalists, key=lambda f: median_of[key(f)])
    ratio = median_of[key(choice)] / median_of[key(best_confirmed)]
    by_key = {key(r): r for r in measured}
    tuned_measured = [by_key[key(r)] for r in tuned if "measured_s" in r and key(r) in by_key]
    process = min(r["measured_bytes"] for r in measured)  # none is below the process's own size
    mem_err = [abs(r["predicted_bytes"] - r["measured_bytes"]) / r["measured_bytes"] for r in measured]
    mem_err_model = [abs(r["predicted_model_bytes"] - r["measured_bytes"]) / r["measured_bytes"] for r in measured]
    rho = spearman([r["predicted_s"] for r in measured], [r["measured_s"] for r in measured])
    top_n = sorted(measured, key=lambda r: r["predicted_rank"])

    lines = [
        "# strata tune against exhaustive measurement (CPU)", "",
        f"Command: `python bench/tune.py --ranks {args.ranks}"
        + (f" --exhaustive-runs {args.exhaustive_runs}" if args.exhaustive_runs > 1 else "")
        + "".join(f" --set {s}" for s in args.set) + "`  ",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.ranks} ranks, one thread each.  ",
        f"Strategy: `{BASE}` with " + ", ".join(f"`{s}`" for s in sets) + ".", "",
        f"* Exhaustive: `{' '.join(ex_cmd[1:])}`: {len(measured)} candidates measured ({len(failed)} failed), "
        f"{ex_wall:.0f} s" + (f" (run 1 of {args.exhaustive_runs}, each with a fresh cache)." if repeats else "."),
        f"* Tune: `{' '.join(tu_cmd[1:])}`: {tu_wall:.0f} s = **{100 * tu_wall / ex_wall:.1f}%** of the exhaustive time "
        f"(target <= 25%).",
        f"* Tune's choice: {choice['layout']}; {'; '.join(choice['choices'])}: {choice['measured_s'] * 1000:.2f} ms in tune's "
        f"own trials.",
        f"* Confirmed ({args.confirm} interleaved trials of each, median): tune's choice {median_of[key(choice)] * 1000:.2f} ms, the "
        f"best {best_confirmed['layout']}; {'; '.join(best_confirmed['choices'])} {median_of[key(best_confirmed)] * 1000:.2f} ms: "
        f"tune's choice is **{ratio:.3f}x** the best (target <= 1.10x).",
        f"* From the exhaustive measurement alone: the fastest, {best['layout']}; {'; '.join(best['choices'])}, "
        f"{best['measured_s'] * 1000:.2f} ms (predicted rank {best['predicted_rank']}); tune's choice "
        f"{choice_in_exhaustive['measured_s'] * 1000:.2f} ms = {choice_in_exhaustive['measured_s'] / best['measured_s']:.3f}x.",
        f"* Predicted vs measured step time over the {len(measured)} candidates: Spearman **{rho:.3f}** (target >= 0.8)"
        + (f", each candidate's measured time the median of its {args.exhaustive_runs} exhaustive trials; against run 1's "
           f"single trials alone {single_rho:.3f}. Test-retest, run 1's measurements against run 2's over {retest[1]} "
           f"candidates: Spearman {retest[0]:.3f} (how far the measurements agree with themselves)."
           if retest else "."),
        f"* Predicted vs measured peak memory per rank: median error {100 * statistics.median(mem_err):.1f}%, "
        f"worst **{100 * max(mem_err):.1f}%** (target <= 15%), the first trial's calibration "
        f"({(measured[0]['predicted_bytes'] - measured[0]['predicted_model_bytes']) / 2**20:+.0f} MiB) included; the model alone: "
        f"median {100 * statistics.median(mem_err_model):.1f}%, worst {100 * max(mem_err_model):.1f}%. The smallest measured peak, "
        f"{process / 2**20:.0f} MiB, is mostly the process itself (libtorch, MPI, plugins).", "",
        "Confirmation trials (ms per step, each the median of 4 steps after 2 warm-up):", "",
        "| candidate | exhaustive trial | confirmation trials | median |", "|---|---|---|---|",
    ] + [f"| {f['layout']}; {'; '.join(f['choices'])}{' (tune' + chr(39) + 's choice)' if key(f) == key(choice) else ''} | "
         f"{f['measured_s'] * 1000:.2f} | {', '.join(f'{v * 1000:.2f}' for v in confirmed[key(f)])} | {median_of[key(f)] * 1000:.2f} |"
         for f in finalists] + [
        "", "Every candidate, in predicted order:", "",
        "| predicted rank | layout | choices | predicted ms | measured ms | predicted MiB (calibrated) | measured MiB | memory error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in top_n:
        lines.append(f"| {r['predicted_rank']} | {r['layout']} | {'; '.join(r['choices'])} | {r['predicted_s'] * 1000:.2f} | "
                     f"{r['measured_s'] * 1000:.2f} | {r['predicted_bytes'] / 2**20:.0f} | {r['measured_bytes'] / 2**20:.0f} | "
                     f"{100 * (r['predicted_bytes'] - r['measured_bytes']) / r['measured_bytes']:+.1f}% |")
    for r in failed:
        lines.append(f"| {r['predicted_rank']} | {r['layout']} | {'; '.join(r['choices'])} | {r['predicted_s'] * 1000:.2f} | "
                     f"{r['verdict']} | | | |")
    lines += ["", "Tune's own output:", "", "```", tu_text.strip(), "```", ""]
    pathlib.Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines[:16]))


if __name__ == "__main__":
    main()
