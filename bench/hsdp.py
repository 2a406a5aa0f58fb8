"""Hybrid sharding (fsdp shard_size = S): model-state bytes per rank and collective bytes per step
against the formulas of ../shared/specs/memory.md, and step time, at several S (issue 58).

usage: python bench/hsdp.py [--strata build/bin/strata] [--out bench/results/hsdp_cpu.md] [--ranks 4,6]

Job: examples/strategies/fsdp.toml's GPT widened to 6 x 256 (vocabulary 256, seq 128), fp32 AdamW,
global batch 12, 8 steps, one thread per rank, every rank on this machine. For D data ranks, every
S that divides D: S = D is plain fsdp, S = 1 replicates everything (ddp-like, through fsdp's
units). Measured per run (metrics.jsonl of the last step; each the maximum over the ranks):
mem_params + mem_grads + mem_optimizer bytes (what the optimizer step holds), fsdp_gather_bytes,
fsdp_reduce_bytes and fsdp_replica_reduce_bytes (the buffers the collectives filled or sent this
step), the median step_ms of steps 3..8. Formulas: model states 16 Psi / S; buffers: reduce 4 Psi,
replica 4 Psi / S (each unit padded to a multiple of S). Bytes on the wire per rank follow from the
buffers with ring algorithms' factors: (S-1)/S of every gather and of the reduce-scatter within the
shard group, 2 (R-1)/R of the replica all-reduce across R = D/S groups; the only traffic between
groups (nodes) is the last. MPI's own algorithm choice is not observed here.
"""
import argparse, json, os, shutil, statistics, subprocess, tempfile

from sharded_init import cpu_model  # bench/, beside this file

COMMON = ["--set", "model.n_layer=6", "--set", "model.d_model=256", "--set", "model.n_head=4", "--set", "job.steps=8",
          "--set", "job.global_batch=12", "--set", "job.threads=1", "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0",
          "--set", "job.log_every=1"]


def run(strata, ranks, shard):
    out = tempfile.mkdtemp(prefix="hsdp_")
    cmd = [strata, "run", "-n", str(ranks), "examples/strategies/fsdp.toml", "--out", out, "--overwrite", *COMMON]
    if shard:
        cmd += ["--set", f"pass.fsdp.shard_size={shard}"]
    else:
        cmd += ["--disable", "fsdp"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in line]
    shutil.rmtree(out)
    return steps, " ".join(cmd[1:]).replace(out, "OUT")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/hsdp_cpu.md")
    ap.add_argument("--ranks", default="4,6")
    a = ap.parse_args()
    single, single_cmd = run(a.strata, 1, 0)
    psi4 = single[-1]["mem_params_bytes"]  # 4 Psi: fp32 parameters of one process
    rows, commands = [], [single_cmd]
    for d in map(int, a.ranks.split(",")):
        for s in [s for s in range(1, d + 1) if d % s == 0]:
            steps, cmd = run(a.strata, d, s)
            commands.append(cmd)
            last = steps[-1]
            states = last["mem_params_bytes"] + last["mem_grads_bytes"] + last["mem_optimizer_bytes"]
            r = d // s
            gather, reduce, replica = last["fsdp_gather_bytes"], last["fsdp_reduce_bytes"], last.get("fsdp_replica_reduce_bytes", 0)
            wire_in = (gather + reduce) * (s - 1) / s
            wire_across = replica * 2 * (r - 1) / r
            ms = statistics.median(x["step_ms"] for x in steps[2:])
            loss_diff = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(steps, single))
            rows.append(f"| {d} | {s} | {r} | {states / 2**20:.2f} | {4 * psi4 / s / 2**20:.2f} | {states / (4 * psi4 / s):.4f} | "
                        f"{reduce / 2**20:.2f} | {psi4 / 2**20:.2f} | {replica / 2**20:.2f} | {(psi4 / s if r > 1 else 0) / 2**20:.2f} | "
                        f"{wire_in / 2**20:.2f} | {wire_across / 2**20:.2f} | {ms:.1f} | {loss_diff:.1e} |")
            print(rows[-1], flush=True)
    lines = ["# Hybrid sharding (HSDP): model states and collective bytes per rank against the formulas (CPU)", "",
             "Command: `python bench/hsdp.py`  ",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores (ranks oversubscribed: step times compare shapes of "
             "communication on one machine, not a cluster); one thread per rank; 8 steps.", "",
             f"Psi = {int(psi4) // 4} parameters (4 Psi = {psi4 / 2**20:.2f} MiB of fp32 weights, the one-process run's mem_params_bytes).",
             "States: mem_params + mem_grads + mem_optimizer of the last step (max over ranks); 16 Psi / S: the formula. "
             "Buffers: what this step's reduce-scatters sent (formula 4 Psi) and the replica all-reduces averaged "
             "(formula 4 Psi / S; none with one group). Wire per rank, derived from those buffers with ring factors: within the shard group "
             "(S-1)/S of the gathers and the reduce-scatter; across groups 2 (R-1)/R of the replica all-reduce. "
             "Loss: worst relative difference from the one-process run over the 8 steps.", "",
             "| D | S | R | states MiB | 16 Psi / S MiB | ratio | reduce buffer MiB | 4 Psi MiB | replica buffer MiB | 4 Psi / S MiB | "
             "wire within group MiB | wire across groups MiB | step ms | loss vs 1 process |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "", "Commands (OUT: a temporary run directory):", "",
             *[f"* `strata {c}`" for c in commands], "",
             "What it shows: the model states per rank are 16 Psi / S to within the padding of each unit to a multiple "
             "of S (ratio 1.0000 at 4 decimals); every step reduce-scatters the whole gradient (4 Psi) within the shard group "
             "and averages 1/S of it over the replicas, so the bytes that leave a group fall as S grows (2 (R-1)/R x 4 Psi / S) "
             "while those inside it rise ((S-1)/S of the gathers and reduce-scatter). The losses equal one process's. "
             "Step times here are of oversubscribed ranks on 2 cores, where nothing is faster for crossing fewer links; "
             "they say nothing about a cluster.", ""]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    open(a.out, "w").write("\n".join(lines))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
