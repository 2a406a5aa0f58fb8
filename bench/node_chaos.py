"""Node chaos: one run loses a random node at random steps, --losses times, and recovers each
time by itself from snapshot replicas; a second run kills single ranks while their snapshot is
on its way to the replicas. Both must end bit-identical to an uninterrupted run.

usage: python bench/node_chaos.py [--strata build/bin/strata] [--losses 20] [--kills 10] [--seed 1]
                                  [--out bench/results/node_chaos_cpu.md]

Job: tests/cli/parity.toml (GPT, 1 block, seq 32), 4 ranks as 2 simulated nodes of 2
(`--simulate-nodes 2`), a flash snapshot every step, every 10th persisted, [job]
snapshot_replicas 1. Faults are chained with STRATA_FAULT's "@ATTEMPT" qualifier: attempt k
loses node n_k at step s_k (s_k increasing, so each attempt reaches its fault). Each recovery's
figures come from events.jsonl: steps lost (step reached minus step resumed), seconds from the
failure to the first new step, bytes of disk checkpoint loaded, where each rank's state came
from. Bit-identity: every step's loss and gradient norm in metrics.jsonl, and the final
checkpoint's files byte for byte.
"""
import argparse, glob, hashlib, json, os, random, re, statistics, subprocess

from machine import cpu_model

JOB = ["--simulate-nodes", "2", "--set", "job.flash_every=1", "--set", "job.checkpoint_every=10", "--set", "job.log_every=10",
       "--set", "job.global_batch=12", "--set", "job.threads=1", "--set", "job.restart_backoff=0", "--set", "job.hang_timeout=20",
       "--set", "model.n_layer=1", "--set", "model.seq_len=32", "--set", "model.dropout=0.1", "--set", "job.snapshot_replicas=1"]


def run(strata, out, steps, restarts, fault=None):
    env = dict(os.environ)
    if fault:
        env["STRATA_FAULT"] = fault
    cmd = [strata, "run", "-n", "4", "tests/cli/parity.toml", "--out", out, "--overwrite", "--set", f"job.steps={steps}",
           "--set", f"job.max_restarts={restarts}", *JOB]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{out}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return [json.loads(l) for l in open(f"{out}/events.jsonl")]


def trajectory(out):
    strip = lambda line: re.sub(r'"[a-z_]*_ms":[^,}]*,?|"mem_peak_bytes":[^,}]*,?', "", line)
    return [strip(l) for l in open(f"{out}/metrics.jsonl")]


def final_files(out):
    newest = sorted(glob.glob(f"{out}/checkpoints/step_*"))[-1]
    return {os.path.basename(f): hashlib.sha256(open(f, "rb").read()).hexdigest() for f in sorted(glob.glob(f"{newest}/*.safetensors"))}


def recoveries(events):
    failures = [e for e in events if e["event"] == "failure"]
    recovered = {e["attempt"]: e for e in events if e["event"] == "recovered"}
    return [(f, recovered[f["attempt"] + 1]) for f in failures if f["attempt"] + 1 in recovered]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--losses", type=int, default=20)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench/results/node_chaos_cpu.md")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = "/tmp/strata_node_chaos"
    steps = 3 * max(a.losses, a.kills) + 10
    run(a.strata, f"{work}/full", steps, 0)
    reference, reference_files = trajectory(f"{work}/full"), final_files(f"{work}/full")

    def chain(count, make):
        fault_steps = sorted(rng.sample(range(3, steps - 2), count))
        return ";".join(make(k, s) for k, s in enumerate(fault_steps)), fault_steps

    cases = []
    loss_fault, loss_steps = chain(a.losses, lambda k, s: f"lose_node {rng.randrange(2)} {s} @{k}")
    kill_fault, kill_steps = chain(a.kills, lambda k, s: f"kill_in_replica {rng.randrange(4)} {s} @{k}")
    for name, fault, count in (("losses", loss_fault, a.losses), ("kills", kill_fault, a.kills)):
        events = run(a.strata, f"{work}/{name}", steps, count + 1, fault)
        same_steps = trajectory(f"{work}/{name}") == reference
        same_files = final_files(f"{work}/{name}") == reference_files
        cases.append((name, fault, recoveries(events), same_steps, same_files, [e for e in events if e["event"] == "finish"][0]))

    lines = ["# Node chaos on CPU: nodes lost and ranks killed mid-replication, recovered from snapshot replicas", "",
             f"Command: `python bench/node_chaos.py --losses {a.losses} --kills {a.kills} --seed {a.seed}`", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores. Job: GPT 1 block, seq 32, {steps} steps; 4 ranks (ddp, one thread "
             "each) as 2 simulated nodes of 2 ranks; a flash snapshot every step, every 10th persisted; one replica per node.", ""]
    for name, fault, recs, same_steps, same_files, finish in cases:
        lost = [f["step_reached"] - r["resumed_step"] for f, r in recs]
        seconds = [r["failure_to_first_step_s"] for f, r in recs]
        disk = sum(r["disk_checkpoint_bytes"] for f, r in recs)
        peers = sum(1 for f, r in recs if any(s.startswith("peer") for s in r["sources"]))
        lines += [f"## {'Nodes lost' if name == 'losses' else 'Single ranks killed mid-replication'}: {len(recs)} recoveries in one run", "",
                  f"Faults (STRATA_FAULT): `{fault}`", "",
                  "| figure | value |", "|---|---|",
                  f"| recoveries, all automatic (no --resume) | {len(recs)} (restarts in the finish event: {finish['restarts']}) |",
                  f"| every step's loss and gradient norm equal to the uninterrupted run's | {'yes' if same_steps else '**NO**'} |",
                  f"| final checkpoint's files byte-identical to the uninterrupted run's | {'yes' if same_files else '**NO**'} |",
                  f"| steps lost per recovery: median / max / total | {statistics.median(lost):.0f} / {max(lost)} / {sum(lost)} |",
                  f"| seconds from the failure to the first new step: median / max | {statistics.median(seconds):.2f} / {max(seconds):.2f} |",
                  f"| bytes of disk checkpoint loaded, all recoveries | {disk:,} |",
                  f"| recoveries where some rank's state came from a peer node's replica | {peers} |",
                  f"| goodput of the run / wall s | {finish['goodput']:.3f} / {finish['wall_s']:.1f} |", "",
                  "| # | step reached | resumed | sources | failure to first step s |", "|---|---|---|---|---|",
                  *[f"| {i + 1} | {f['step_reached']} | {r['resumed_step']} | {', '.join(r['sources'])} | {r['failure_to_first_step_s']:.2f} |"
                    for i, (f, r) in enumerate(recs)], ""]
    lines += ["Published figures for comparison (other systems, other scales; not measured here): torchft recovers a "
              "replica group in about 17 s on Kubernetes with reused hosts against 53-115 s with a pod restart "
              "(examples/monarch/README.md); DLRover's replicas (PR #1153) restore a lost node's shard from its partner "
              "node's memory instead of storage, without a published recovery time. Here a recovery is dominated by "
              "restarting 4 processes (libtorch start-up) on a 2-core machine, and the model is tiny: what the run "
              "shows is that every recovery is automatic, exact and reads nothing from disk, not a recovery time to "
              "compare."]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not all(c[3] and c[4] for c in cases):
        raise SystemExit("a chaos run is not bit-identical to the uninterrupted run")


if __name__ == "__main__":
    main()
