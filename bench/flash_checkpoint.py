"""Flash checkpoints against the memory-copy bound and against disk checkpoints.

usage: python bench/flash_checkpoint.py [--strata build/bin/strata] [--steps 8] [--rounds 5] [--out bench/results/flash_checkpoint_cpu.md]

Job: tests/cli/parity.toml's GPT grown to d_model 512, 8 blocks, vocabulary 8192 (about 29 M
parameters; with AdamW's two moments about 350 MB of state), seq 64, 2 ranks under ddp with one
thread each. ddp ranks share the replicated state's writing, so each rank's checkpoint file holds
about half of it.

Three runs of the same job:
  * flash: a flash snapshot every step ([job] flash_every 1), every 8th persisted by the supervisor,
    in --rounds interleaved rounds, each between two measurements of the bound;
  * disk:  a disk checkpoint every step (the ranks write, fsync and hash their files);
  * none:  no checkpoint but the last, for the step time without checkpoints.
Blocking time is each step's checkpoint_ms (metrics.jsonl, rank 0, which waits for the slowest
rank before going on), the first snapshot (which sizes and maps the shared memory) reported apart.
The memory-copy bound is each rank's file size over the copy bandwidth measured here with both
ranks' copies running at once (two processes, numpy copies into pre-faulted buffers of the same
size). This shared machine's copy rate moves by 20-40% from minute to minute, so each round's
ratio is its blocking time over the mean of the bounds taken just before and just after it, and
the ratio reported is the median over the rounds. Then one kill per mode: the restart's reload time from memory against from disk.
"""
import argparse, glob, json, mmap, multiprocessing as mp, os, statistics, subprocess, time

import numpy as np

JOB = ["--set", "model.d_model=512", "--set", "model.n_layer=8", "--set", "model.n_head=8", "--set", "model.vocab_size=8192",
       "--set", "model.seq_len=64", "--set", "job.global_batch=2", "--set", "job.micro_batch=1", "--set", "job.threads=1",
       "--set", "job.log_every=100", "--set", "job.eval_every=0", "--set", "job.max_restarts=1", "--set", "job.restart_backoff=0"]


def run(strata, out, steps, extra, fault=None):
    env = dict(os.environ)
    if fault:
        env["STRATA_FAULT"] = fault
    subprocess.run([strata, "run", "-n", "2", "tests/cli/parity.toml", "--out", out, "--overwrite", "--set", f"job.steps={steps}",
                    *JOB, *extra], check=True, capture_output=True, env=env)
    metrics = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    events = [json.loads(l) for l in open(f"{out}/events.jsonl")]
    return metrics, events


def copy_seconds(nbytes, repeats, queue, into_shm):
    src = np.ones(nbytes, dtype=np.uint8)
    if into_shm:  # a /dev/shm mapping like a snapshot slot's (4 KiB pages where shmem THP is off)
        path = f"/dev/shm/strata_copy_bound_{os.getpid()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, nbytes)
        mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        dst = np.frombuffer(mapping, dtype=np.uint8)
    else:
        dst = np.zeros(nbytes, dtype=np.uint8)
    dst[:] = 0  # written once: pre-faulted
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    queue.put(statistics.median(times))
    if into_shm:
        del dst
        mapping.close()
        os.close(fd)
        os.unlink(path)


def concurrent_copy_seconds(nbytes, processes=2, repeats=7, into_shm=False):
    queue = mp.Queue()
    procs = [mp.Process(target=copy_seconds, args=(nbytes, repeats, queue, into_shm)) for _ in range(processes)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return max(results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--persist-every", type=int, default=8,
                    help="checkpoint_every: every how many snapshots the supervisor persists (the others stay in memory)")
    ap.add_argument("--rounds", type=int, default=5, help="flash runs, each between two measurements of the bound")
    ap.add_argument("--out", default="bench/results/flash_checkpoint_cpu.md")
    a = ap.parse_args()
    work = "/tmp/strata_flash_bench"
    steps = a.steps
    persist = ["--set", "job.flash_every=1", "--set", f"job.checkpoint_every={a.persist_every}"]
    # The file size is known after a first run; it is the same in every run of this job.
    run(a.strata, f"{work}/sizes", 1, persist)
    per_rank = max(os.path.getsize(f) for f in glob.glob(f"{work}/sizes/checkpoints/step_*/rank_*.safetensors"))
    rounds = []  # (bound before, blocking ms of the snapshots of steps 2.., bound after, metrics)
    bound_after = concurrent_copy_seconds(per_rank) * 1000
    for r in range(a.rounds):
        bound_before = bound_after
        flash, flash_events = run(a.strata, f"{work}/flash", steps, persist)
        bound_after = concurrent_copy_seconds(per_rank) * 1000
        rounds.append((bound_before, [m["checkpoint_ms"] for m in flash if "checkpoint_ms" in m], bound_after, flash))
    disk, _ = run(a.strata, f"{work}/disk", steps, ["--set", "job.checkpoint_every=1"])
    none, _ = run(a.strata, f"{work}/none", steps, ["--set", "job.checkpoint_every=0"])
    files = sorted(glob.glob(f"{work}/flash/checkpoints/step_*/rank_*.safetensors"))[-2:]
    single = concurrent_copy_seconds(per_rank, processes=1) * 1000
    shm_bound = concurrent_copy_seconds(per_rank, into_shm=True) * 1000
    round_rows = []
    for r, (before, blocking, after, _) in enumerate(rounds):
        bound_r = (before + after) / 2
        round_rows.append((r + 1, before, after, statistics.median(blocking[1:]), statistics.median(blocking[1:]) / bound_r))
    ratio = statistics.median(row[4] for row in round_rows)
    all_bounds = statistics.median([rounds[0][0]] + [after for _, _, after, _ in rounds])

    # Snapshots some rank skipped (its older slot was being persisted) are counted apart.
    flash_ms = [ms for _, blocking, _, _ in rounds for ms in blocking[1:]]  # every round's snapshots of steps 2..
    firsts = [blocking[0] for _, blocking, _, _ in rounds]
    skipped = sum(1 for _, _, _, metrics in rounds for m in metrics if "snapshot_skipped_ms" in m)
    disk_ms = [m["checkpoint_ms"] for m in disk]
    steady_flash = statistics.median(flash_ms)
    persists = [e for e in flash_events if e["event"] == "persist"]
    persist_s = statistics.median([e["seconds"] for e in persists])
    step = lambda ms: statistics.median([m["step_ms"] for m in ms[1:]])

    # One kill per mode, at the step after a checkpoint: what the restart spends reloading.
    _, fe = run(a.strata, f"{work}/flash_kill", steps, persist, "kill 1 4")
    _, de = run(a.strata, f"{work}/disk_kill", steps, ["--set", "job.checkpoint_every=1"], "kill 1 4")
    finish = lambda ev: [e for e in ev if e["event"] == "finish"][0]

    lines = ["# Flash checkpoints on CPU: blocking time against the memory-copy bound and against disk", "",
             f"Command: `python bench/flash_checkpoint.py --steps {steps} --persist-every {a.persist_every} --rounds {a.rounds}`", "",
             "Job: GPT d_model 512, 8 blocks, vocabulary 8192, seq 64; AdamW; 2 ranks (ddp), one thread each, on this "
             f"2-core machine; a snapshot every step, every {a.persist_every}th persisted by the supervisor. Each rank's checkpoint file (its share of the state): "
             f"**{per_rank / 2**20:.1f} MiB**; the whole state on disk: {sum(os.path.getsize(f) for f in files) / 2**20:.1f} MiB.", "",
             "The memory-copy bound is one rank's file copied while the other rank copies its own (two processes, median of 7 "
             "copies into pre-faulted buffers), taken before and after every flash run; a round's ratio is its snapshots' "
             "median blocking time over the mean of those two bounds.", "",
             "| round | bound before ms | bound after ms | blocking ms (median, steps 2..) | ratio |", "|---|---|---|---|---|",
             *[f"| {n} | {b:.1f} | {af:.1f} | {blk:.1f} | {rt:.2f}x |" for n, b, af, blk, rt in round_rows], "",
             "| figure | value |", "|---|---|",
             f"| ratio to the memory-copy bound, median of the {a.rounds} rounds (target <= 1.25) | **{ratio:.2f}x** |",
             f"| the same as one figure: every round's blocking median over the median of all {a.rounds + 1} bounds | {steady_flash / all_bounds:.2f}x |",
             f"| the same copy into a /dev/shm mapping, as a snapshot's | {shm_bound:.1f} ms |",
             f"| the same copy with the other core idle | {single:.1f} ms |",
             f"| flash snapshot blocking time, median of every round's snapshots of steps 2..{steps} | **{steady_flash:.1f} ms** |",
             f"| snapshots skipped by a rank while the supervisor persisted its older slot | {skipped} of {len(flash_ms) + len(firsts)} |",
             f"| first flash snapshot (sizes, reserves and maps the shared memory), median over rounds | {statistics.median(firsts):.1f} ms |",
             f"| disk checkpoint blocking time (write, fsync, SHA-256, manifest), median of steps 2..{steps} | {statistics.median(disk_ms[1:]):.1f} ms |",
             f"| disk / flash | {statistics.median(disk_ms[1:]) / steady_flash:.1f}x |",
             f"| supervisor's background persist of one snapshot (both ranks' files), median | {persist_s * 1000:.0f} ms (not blocking) |",
             f"| step time without checkpoints / with a flash snapshot every step / with a disk checkpoint every step (medians) | "
             f"{step(none):.0f} / {step(flash):.0f} / {step(disk):.0f} ms |",
             f"| restart after kill -9: reload from shared memory | {finish(fe)['reload_s'] * 1000:.0f} ms |",
             f"| restart after kill -9: reload from disk | {finish(de)['reload_s'] * 1000:.0f} ms |",
             f"| goodput of the killed runs, flash / disk | {finish(fe)['goodput']:.3f} / {finish(de)['goodput']:.3f} |",
             "",
             "Blocking time counts from gathering the state to the all-reduce after the copy, in which every rank waits "
             "for the slowest: what training loses per checkpoint. The checksum runs after the copy on a background thread "
             "and is not in it; it shares the cores with training, so it shows in the step time instead."]
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
