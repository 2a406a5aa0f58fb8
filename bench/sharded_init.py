"""Start-up memory of fsdp ranks: sharded initialisation against the whole model per rank (issue 58).

usage: python bench/sharded_init.py [--strata build/bin/strata] [--out bench/results/sharded_init_cpu.md] [--sizes 124M,350M,774M]

Job: examples/strategies/fsdp_bf16.toml (GPT-2 vocabulary, amp bf16, act_checkpoint) at GPT-2 shapes
small (12 x 768), medium (24 x 1024) and large (36 x 1280), seq 32, one step, fsdp 1, 2 and 4 on as
many ranks (large: 2 and 4), each run twice: sharded_init = true (the default: a rank keeps its chunk of every unit
as the factory adds each block) and false (every rank builds the whole model, then keeps its
shards). Each rank logs right after the build (core's engine/model_build.cpp) its peak resident set
so far (VmHWM) and its resident set before the build started.

Reported per run: the largest build peak above the resident set before the build over the ranks,
against the formula of issue 58: this rank's fp32 weights (a 1/fsdp chunk of every unit) plus one
whole block while it is drawn (the largest: the embedding, (vocab + seq) x d_model), and for the
whole build against the whole model's fp32 weights. Target: sharded <= 1.25 x formula.
"""
import argparse, glob, os, re, shutil, subprocess, tempfile

from machine import cpu_model

SHAPES = {"124M": (12, 768, 12), "350M": (24, 1024, 16), "774M": (36, 1280, 20)}
VOCAB, SEQ = 50257, 32
COMMON = ["--set", f"model.seq_len={SEQ}", "--set", "job.steps=1", "--set", "job.threads=1", "--set", "job.eval_every=0",
          "--set", "job.checkpoint_every=0"]
LINE = re.compile(r"model built: .*peak (\d+) MiB \((\d+) MiB before the build\)")
MIB = 1 << 20


def run(strata, size, ranks, sharded):
    layers, d, heads = SHAPES[size]
    out = tempfile.mkdtemp(prefix="sharded_init_")
    cmd = [strata, "run", "-n", str(ranks), "examples/strategies/fsdp_bf16.toml", "--out", out, "--overwrite", *COMMON,
           "--set", f"model.n_layer={layers}", "--set", f"model.d_model={d}", "--set", f"model.n_head={heads}",
           "--set", f"job.global_batch={ranks}", "--set", f"pass.fsdp.sharded_init={'true' if sharded else 'false'}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:  # the whole build of a large model may not fit: say how it ended
        events = open(os.path.join(out, "events.jsonl")).read() if os.path.exists(os.path.join(out, "events.jsonl")) else ""
        cause = re.search(r'"cause":"([^"]*)"', events)
        shutil.rmtree(out)
        return None, None, " ".join(cmd[1:]).replace(out, "OUT") + f"  (failed: {cause.group(1) if cause else done.stderr.strip()[-200:]})"
    above = []
    for log in sorted(glob.glob(os.path.join(out, "logs", "rank_*.log"))):
        peak, before = map(int, LINE.search(open(log).read()).groups())
        above.append(peak - before)
    shutil.rmtree(out)  # the final checkpoint: 12 B per parameter
    return max(above), min(above), " ".join(cmd[1:]).replace(out, "OUT")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/sharded_init_cpu.md")
    ap.add_argument("--sizes", default="124M,350M,774M")
    a = ap.parse_args()
    rows, commands = [], []
    for size in a.sizes.split(","):
        layers, d, _ = SHAPES[size]
        block = 12 * d * d + 13 * d
        embedding = (VOCAB + SEQ) * d
        params = layers * block + embedding + 2 * d
        # fsdp 1 builds whole either way (nothing to shard); above 500 M parameters its one process
        # would hold 16 B per parameter plus the step on this 24 GiB machine, so it is left out.
        for ranks in ((1, 2, 4) if params < 500e6 else (2, 4)):
            most, least, cmd = run(a.strata, size, ranks, True)
            whole_most, whole_least, whole_cmd = run(a.strata, size, ranks, False)
            commands += [cmd, whole_cmd]
            formula = (4 * params / ranks + 4 * max(block, embedding)) / MIB
            sharded = f"{least}-{most} | {formula:.0f} | {most / formula:.2f}" if most is not None else f"failed | {formula:.0f} | -"
            whole = (f"{whole_least}-{whole_most} | {4 * params / MIB:.0f} | {whole_most / (4 * params / MIB):.2f}"
                     if whole_most is not None else f"failed (see its command) | {4 * params / MIB:.0f} | -")
            rows.append(f"| {size} ({params / 1e6:.0f} M) | {ranks} | {sharded} | {whole} |")
            print(rows[-1], flush=True)
    lines = ["# fsdp start-up memory: sharded initialisation vs the whole model per rank (CPU)", "",
             "Command: `python bench/sharded_init.py`  ",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores; ranks with one thread each, one step.", "",
             "Build peak above the resident set before the build (VmHWM at the end of the build, from each rank's log), "
             "lowest-highest over the ranks. Formula (sharded): this rank's fp32 weights (total / fsdp) plus the largest "
             "block while it is drawn (the embedding: (50257 + 32) x d_model x 4 B); whole: every fp32 weight. "
             "Target of issue 58: sharded peak <= 1.25 x formula. At fsdp 1 there is nothing to shard: both runs build whole "
             "(`strata plan`: one data rank), so its row is the whole model against a formula that assumes a keeper.", "",
             "| model | fsdp | sharded: peak above before MiB | formula MiB | max / formula | whole: peak above before MiB | "
             "whole weights MiB | max / weights |",
             "|---|---|---|---|---|---|---|---|", *rows, "", "Commands (OUT: a temporary run directory):", "",
             *[f"* `strata {c}`" for c in commands], ""]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    open(a.out, "w").write("\n".join(lines))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
