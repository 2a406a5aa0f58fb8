"""Start-up memory of a pipeline rank: its own stages built alone against the whole model per rank.

usage: python bench/pipeline_startup.py [--strata build/bin/strata] [--out bench/results/pipeline_startup_cpu.md]

Job: examples/strategies/pipeline_parallel.toml's byte-level GPT grown to d_model 768, 8
transformer blocks (10 blocks with the embedding and the head; about 57 M parameters), seq 64,
pipeline 4 on 4 ranks, one step. Each rank logs, right after its model is built (core's
engine/model_build.cpp), the parameters it holds and its peak resident set so far (VmHWM).

Three runs:
  * alone:  partition "uniform": each rank builds only its stage's blocks (Pass::blocks_to_build);
  * whole:  partition "balanced", which measures every block and so builds the whole model on every
            rank first, as every partition did before stages were built alone;
  * tiny:   the same command with d_model 32, for the process's own baseline (libtorch, MPI,
            plugins, the factory run).
Reported per rank: the peak at build above the tiny run's peak on the same rank, against the
stage's model states (16 bytes per parameter: fp32 weights, gradients and AdamW's two moments)
and its weights alone (4 bytes per parameter).
"""
import argparse, glob, os, re, subprocess, tempfile

MODEL = ["--set", "parallel.pipeline=4", "--set", "model.n_layer=8", "--set", "model.n_head=4", "--set", "model.seq_len=64",
         "--set", "job.steps=1", "--set", "job.global_batch=4", "--set", "job.threads=1", "--set", "job.eval_every=0",
         "--set", "job.checkpoint_every=0"]
LINE = re.compile(r"model built: (\d+) parameters held .*; resident (\d+) MiB, peak (\d+) MiB")


def run(strata, d_model, partition):
    out = tempfile.mkdtemp(prefix="pp_startup_")
    cmd = [strata, "run", "-n", "4", "examples/strategies/pipeline_parallel.toml", "--out", out, "--overwrite", *MODEL,
           "--set", f"model.d_model={d_model}", "--set", f"pass.pipeline_parallel.partition={partition}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    ranks = []
    for log in sorted(glob.glob(os.path.join(out, "logs", "rank_*.log"))):
        m = LINE.search(open(log).read())
        ranks.append((int(m.group(1)), int(m.group(3))))
    return ranks, " ".join(cmd[1:]).replace(out, "OUT")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/pipeline_startup_cpu.md")
    a = ap.parse_args()
    alone, alone_cmd = run(a.strata, 768, "uniform")
    whole, whole_cmd = run(a.strata, 768, "balanced")
    tiny, tiny_cmd = run(a.strata, 32, "uniform")
    mib = 1 << 20
    lines = ["# Pipeline start-up memory: stages built alone vs the whole model per rank (CPU)", "",
             "Command: `python bench/pipeline_startup.py`  ", f"Machine: {os.cpu_count()} cores; 4 ranks, one thread each.", "",
             f"* alone: `strata {alone_cmd}`", f"* whole: `strata {whole_cmd}`", f"* tiny (baseline): `strata {tiny_cmd}`", "",
             "Peak resident set at the end of the model build (VmHWM, from each rank's log), minus the tiny run's on the same rank. "
             "Model states: 16 B per parameter the rank holds after its stage is cut (weights, gradients, AdamW's two moments); "
             "weights: 4 B per parameter.", "",
             "| rank | parameters held | stage weights MiB | stage model states MiB | alone: peak above baseline MiB | "
             "/ model states | whole: peak above baseline MiB | / model states |",
             "|---|---|---|---|---|---|---|---|"]
    for r, ((params, peak_alone), (_, peak_whole), (_, peak_tiny)) in enumerate(zip(alone, whole, tiny)):
        states = 16 * params / mib
        above_alone, above_whole = peak_alone - peak_tiny, peak_whole - peak_tiny
        lines.append(f"| {r} | {params} | {4 * params / mib:.0f} | {states:.0f} | {above_alone} | {above_alone / states:.2f}x | "
                     f"{above_whole} | {above_whole / states:.2f}x |")
    total = whole[0][0]
    lines += ["", f"Whole model: {total} parameters, {4 * total / mib:.0f} MiB of weights on every rank when built whole. "
              "Built alone, a rank's peak is its blocks plus the largest other block while the factory runs "
              "(each dropped as soon as it is added), plus the embedding on the last rank, whose tied head reads it."]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
