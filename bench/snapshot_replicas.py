"""Snapshot replicas ([job] snapshot_replicas): what they cost per snapshot, and what they save
when a whole node is lost.

usage: python bench/snapshot_replicas.py [--strata build/bin/strata] [--steps 24] [--rounds 3]
                                         [--out bench/results/snapshot_replicas_cpu.md]

Job: bench/flash_checkpoint.py's (GPT d_model 512, 8 blocks, vocabulary 8192, seq 64, AdamW,
about 337 MiB of state), 2 ranks under ddp with one thread each, as 2 simulated nodes of one rank
(`strata run -n 2 --simulate-nodes 2`), a flash snapshot every step, every 4th persisted.

  * cost: runs with snapshot_replicas 0 and 1 alternate (--rounds each); per run the median of
    rank 0's checkpoint_ms over the snapshots taken from step 3 on (blocking per snapshot; with
    replicas it includes completing the previous snapshot's transfer and announcing this one's,
    replica_ms, shown apart; the snapshots some rank skipped while the supervisor persisted are
    not counted) and of step_ms; steps 1 and 2's checkpoint_ms apart: the first snapshot maps
    every slot, and with replicas the first transfer touches the receiver's pages, costs paid
    once per run; and the median over every counted snapshot of every round, a figure less at
    the mercy of one noisy run;
  * node loss: node 1 lost (its rank killed, its store deleted) at step 7, without and with
    replicas: the restart's `recovered` event (where each rank's state came from, the step
    resumed, disk bytes loaded, seconds from the failure to the first new step) and the steps lost.
"""
import argparse, json, os, statistics, subprocess

from machine import cpu_model

JOB = ["--set", "model.d_model=512", "--set", "model.n_layer=8", "--set", "model.n_head=8", "--set", "model.vocab_size=8192",
       "--set", "model.seq_len=64", "--set", "job.global_batch=2", "--set", "job.micro_batch=1", "--set", "job.threads=1",
       "--set", "job.log_every=100", "--set", "job.eval_every=0", "--set", "job.max_restarts=1", "--set", "job.restart_backoff=0",
       "--set", "job.flash_every=1", "--set", "job.checkpoint_every=4"]


def run(strata, out, steps, replicas, fault=None):
    env = dict(os.environ)
    if fault:
        env["STRATA_FAULT"] = fault
    cmd = [strata, "run", "-n", "2", "--simulate-nodes", "2", "tests/cli/parity.toml", "--out", out, "--overwrite",
           "--set", f"job.steps={steps}", "--set", f"job.snapshot_replicas={replicas}", *JOB]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    metrics = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    events = [json.loads(l) for l in open(f"{out}/events.jsonl")]
    return metrics, events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/snapshot_replicas_cpu.md")
    ap.add_argument("--losses-only", type=int, choices=(0, 1), default=None,
                    help="with --rounds 0: only the node loss at that snapshot_replicas, printed (the results file is kept)")
    a = ap.parse_args()
    work = "/tmp/strata_replicas_bench"
    rows = []  # (round, replicas, blocking ms, step ms, steps 1 and 2's blocking ms, snapshots counted, replica_ms)
    pooled = {0: [], 1: []}  # every counted snapshot's blocking ms, over all rounds
    for r in range(a.rounds):
        for replicas in (0, 1):
            metrics, _ = run(a.strata, f"{work}/cost_{replicas}", a.steps, replicas)
            taken = [m for m in metrics if "checkpoint_ms" in m]  # a skipped snapshot records snapshot_skipped_ms
            steady = [m for m in taken if m["step"] >= 3]
            first = " / ".join(next((f"{m['checkpoint_ms']:.0f}" for m in taken if m["step"] == s), "-") for s in (1, 2))
            rows.append((r + 1, replicas, statistics.median(m["checkpoint_ms"] for m in steady),
                         statistics.median(m["step_ms"] for m in steady), first, len(steady),
                         statistics.median(m.get("replica_ms", 0.0) for m in steady)))
            pooled[replicas] += [m["checkpoint_ms"] for m in steady]
    if a.rounds > 0:
        image = os.path.getsize(sorted(p for p in (os.path.join(d, f) for d, _, fs in os.walk(f"{work}/cost_1/checkpoints") for f in fs)
                                       if p.endswith(".safetensors"))[-1])
        blocking = {k: statistics.median([row[2] for row in rows if row[1] == k]) for k in (0, 1)}
        step = {k: statistics.median([row[3] for row in rows if row[1] == k]) for k in (0, 1)}
        ratios = [rows[i + 1][2] / rows[i][2] for i in range(0, len(rows), 2)]

    losses = {}
    for replicas in ((0, 1) if a.rounds > 0 else (a.losses_only,)):
        _, events = run(a.strata, f"{work}/lose_{replicas}", a.steps, replicas, "lose_node 1 7")
        failure = [e for e in events if e["event"] == "failure"][0]
        recovered = [e for e in events if e["event"] == "recovered"][0]
        persisted = sum(e["seconds"] for e in events if e["event"] == "persist" and e["when"] == "failure")
        losses[replicas] = (failure, recovered, persisted)

    if a.rounds == 0:
        for k, (f, rec, p) in losses.items():
            print(f"| {k} | {f['step_reached']} | {rec['resumed_step']} | {f['step_reached'] - rec['resumed_step']} | "
                  f"{', '.join(rec['sources'])} | {rec['disk_checkpoint_bytes']:,} | {rec['failure_to_first_step_s']:.2f} | {p:.2f} |")
        return
    lines = ["# Snapshot replicas on CPU: blocking per snapshot, and a node lost", "",
             f"Command: `python bench/snapshot_replicas.py --steps {a.steps} --rounds {a.rounds}`", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores. Job: GPT d_model 512, 8 blocks, vocabulary 8192, seq 64, AdamW; "
             "2 ranks (ddp, one thread each) as 2 simulated nodes of one rank; a flash snapshot every step, every 4th "
             f"persisted. Each rank's image: **{image / 2**20:.1f} MiB**; with one replica each node holds its own rank's "
             f"image and the other's, double-buffered: {4 * image / 2**20:.0f} MiB of shared memory per node (2 without).", "",
             "Runs with and without replicas alternate; figures are rank 0's medians over the snapshots of steps 3.. "
             "that every rank took (the ones skipped while the supervisor persists an older one are not counted). "
             "Steps 1 and 2's snapshots are shown apart: they pay once per run for mapping the slots and, with "
             "replicas, for the first transfer's touching the receiver's pages.", "",
             "| round | snapshot_replicas | blocking per snapshot ms | of which the replicas' own (replica_ms) | step ms | snapshots counted | steps 1 / 2's snapshot ms |",
             "|---|---|---|---|---|---|---|",
             *[f"| {n} | {k} | {b:.1f} | {rep:.1f} | {s:.0f} | {c} | {f} |" for n, k, b, s, f, c, rep in rows], "",
             "| figure | value |", "|---|---|",
             f"| blocking per snapshot, median: without / with one replica | {blocking[0]:.1f} / {blocking[1]:.1f} ms |",
             f"| with / without, median of the rounds' ratios (target <= 1.1) | **{statistics.median(ratios):.2f}x** "
             f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}) |",
             f"| blocking per snapshot, median of every counted snapshot of every round: without / with | "
             f"{statistics.median(pooled[0]):.1f} / {statistics.median(pooled[1]):.1f} ms "
             f"(**{statistics.median(pooled[1]) / statistics.median(pooled[0]):.2f}x**; {len(pooled[0])} / {len(pooled[1])} snapshots) |",
             f"| step time, median: without / with | {step[0]:.0f} / {step[1]:.0f} ms |", "",
             "Node 1 lost at step 7 (its rank killed as the step starts, its store deleted):", "",
             "| snapshot_replicas | steps reached | resumed from | steps lost | sources | disk checkpoint bytes loaded | failure to first new step s | of which persisting at the breakpoint s |",
             "|---|---|---|---|---|---|---|---|",
             *[f"| {k} | {f['step_reached']} | {rec['resumed_step']} | {f['step_reached'] - rec['resumed_step']} | "
               f"{', '.join(rec['sources'])} | {rec['disk_checkpoint_bytes']:,} | {rec['failure_to_first_step_s']:.2f} | {p:.2f} |"
               for k, (f, rec, p) in losses.items()], "",
             "Persisting at the breakpoint: before restarting, the supervisor writes to disk the newest snapshot that is "
             "whole in memory and newer than disk. Without replicas a lost node leaves none; with them the replicas "
             "make the newest one whole again and it is written (SHA-256 and fsync of the whole state) before the "
             "restart, which the seconds to the first new step include.", "",
             "Both recovered runs finish by themselves; bit-identity with an uninterrupted run is checked by the tests "
             "(chaos.node_loss_*), not here. A replica counts once its checksum has arrived with the next snapshot, so a "
             "loss before the next snapshot resumes one snapshot before the newest. DLRover's published figure for the "
             "same idea (PR #1153, replicas in a partner node's memory) is a restore from memory instead of storage; "
             "it publishes no per-snapshot overhead to compare with. The transfer shares this machine's 2 cores with "
             "the two training ranks, so it shows in the step time rather than in the blocking time."]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
