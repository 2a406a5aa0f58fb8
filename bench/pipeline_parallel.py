"""Pipeline parallel on CPU: per-stage idle fraction of each schedule next to its theoretical
bubble, peak memory of gpipe vs 1f1b, and balanced vs uniform partitions with a large vocabulary.

usage: python bench/pipeline_parallel.py [--strata build/bin/strata] [--out bench/results/pipeline_parallel_cpu.md]
                                         [--steps 4]

Model: GPT, 6 transformer blocks (8 blocks with embedding and head), d_model 256, 4 heads,
seq_len 128, byte vocabulary 256 (part 3: vocabulary 32768), data/kjv.txt, micro-batch 1,
one thread per rank, [parallel] pipeline = 4 (4 processes). Figures are Strata's per-step
metrics (metrics.jsonl, rank 0 writes them): pp_idle_fraction_stageN (share of the
forward_backward stage that stage N waited on its neighbours), mem_peak_bytes (the largest peak
RSS of any rank), step_ms; medians over steps 2..steps. The theoretical bubble is the plan's
simulation with F = 1, B = 2 (split: b = W = 1) and the textbook formula. On a machine with
fewer cores than ranks the ranks share cores, so measured idle includes time a rank was ready
but not scheduled; read the columns side by side, not as absolute truth.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

def run(strata, steps, schedule, m, extra=(), n=4):
    out = tempfile.mkdtemp(prefix="pp_bench_")
    cmd = [strata, "run", "-n", str(n), "examples/strategies/pipeline_parallel.toml",
           "--set", "parallel.pipeline=4", "--set", "parallel.data=1", "--disable", "ddp",
           "--set", f"pass.pipeline_parallel.schedule={schedule}", "--set", f"job.global_batch={m}", "--set", "job.micro_batch=1",
           "--set", f"job.steps={steps}", "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0", "--set", "job.threads=1",
           "--set", "model.d_model=256", "--set", "model.n_head=4",
           "--set", "model.seq_len=128", "--out", out, "--overwrite", *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))][1:]
    med = lambda k: statistics.median(r[k] for r in rows)
    return {"idle": [med(f"pp_idle_fraction_stage{s}") for s in range(4)], "peak": med("mem_peak_bytes"), "step_ms": med("step_ms")}, cmd

def planned_bubble(strata, schedule, m, extra=()):
    cmd = [strata, "plan", "-n", "4", "examples/strategies/pipeline_parallel.toml", "--set", "parallel.pipeline=4",
           "--set", "parallel.data=1", "--disable", "ddp", "--set", f"pass.pipeline_parallel.schedule={schedule}",
           "--set", f"job.global_batch={m}", "--set", "job.micro_batch=1", *extra]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    sim = re.search(r"simulated bubble ([0-9.]+) of the step; textbook (.*)", text)
    stages = re.findall(r"^  stage \d.*$", text, re.M)
    return float(sim.group(1)), sim.group(2), stages

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/pipeline_parallel_cpu.md")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    lines = ["# Pipeline parallel on CPU", "", f"Command: `python bench/pipeline_parallel.py --steps {a.steps}`", "",
             f"Machine: {os.cpu_count()} cores; 4 ranks, one thread each.", "",
             "## 1. Idle fraction per stage vs the schedule's bubble (pipeline 4)", "",
             "| schedule | m | measured idle per stage 0..3 | mean | simulated bubble | textbook | step ms |", "|---|---|---|---|---|---|---|"]
    for schedule in ["gpipe", "1f1b", "interleaved", "zero_bubble"]:
        for m in [4, 8, 16]:
            r, _ = run(a.strata, a.steps, schedule, m)
            sim, formula, _ = planned_bubble(a.strata, schedule, m)
            idle = " / ".join(f"{x:.2f}" for x in r["idle"])
            lines.append(f"| {schedule} | {m} | {idle} | {statistics.mean(r['idle']):.2f} | {sim:.3f} | {formula} | {r['step_ms']:.0f} |")
            print(lines[-1], flush=True)
    lines += ["", "## 2. Peak memory, gpipe (m in flight) vs 1f1b (at most p - r in flight), m = 16", "",
              "| schedule | peak RSS of the largest rank (MiB) |", "|---|---|"]
    for schedule in ["gpipe", "1f1b"]:
        r, _ = run(a.strata, a.steps, schedule, 16, ("--set", "model.seq_len=512"))
        lines.append(f"| {schedule} | {r['peak'] / 2**20:.0f} |")
        print(lines[-1], flush=True)
    lines += ["", "## 3. Balanced vs uniform partition, vocabulary 32768 (the head dominates), 1f1b, m = 8", "",
              "| partition | stages (from `strata plan`) | step ms | idle per stage |", "|---|---|---|---|"]
    big = ("--set", "model.vocab_size=32768")
    for partition in ["uniform", "balanced"]:
        extra = big + ("--set", f"pass.pipeline_parallel.partition=\"{partition}\"")
        r, _ = run(a.strata, a.steps, "1f1b", 8, extra)
        _, _, stages = planned_bubble(a.strata, "1f1b", 8, extra)
        lines.append(f"| {partition} | {'<br>'.join(s.strip() for s in stages)} | {r['step_ms']:.0f} | {' / '.join(f'{x:.2f}' for x in r['idle'])} |")
        print(lines[-1], flush=True)
    open(a.out, "w").write("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
