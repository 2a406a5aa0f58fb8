"""[job] host_memory = "keep", "return" and "cache" side by side: step time, peak resident set and
peak of live tensors (CPU).

usage: python bench/host_memory.py [--strata build/bin/strata] [--rounds 3] [--out bench/results/host_memory_cpu.md]

"keep" has glibc's heap hold what a step frees (mmap and trim thresholds at 1 GiB); "return" is
glibc's defaults (a block above 128 KiB mapped for itself and unmapped when freed, so the next
step faults its pages in again); "cache" is "keep" with Strata's counting allocator keeping freed
blocks of 128 KiB and more for the next tensor of the same size, giving back what a whole step did
not take (core/include/strata/core/counting_cpu_allocator.h). Three jobs:
* gpt: one process, GPT 6 x 512, 8 sequences of 256 tokens, AdamW, 2 threads (activations);
* llama: one process, Llama 4 x 256, 2048 tokens, vocab 4096, AdamW, 2 threads;
* fsdp_4: GPT 16 x 1024 (201 M parameters), fsdp over 4 ranks resharding after forward, one
  sequence of 64 tokens a rank, SGD, 1 thread a rank: each step gathers every unit (50 MB fp32)
  twice, the large-model pattern.
The modes run interleaved (keep, return, cache, keep, ...); each run's median step time over its
steps after the first, then the median over rounds; peaks: the largest over rounds and ranks
(mem_peak_bytes: the resident set's high-water mark since the process started, the build
included; mem_device_peak_bytes: live tensor bytes). Losses must be equal across the modes (the
allocator does not change a result); the script fails if they are not.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile

from machine import cpu_model

MODES = ["keep", "return", "cache"]
SINGLE = '[job]\nmodel = "{model}"\ndataset = "synthetic"\n[optimizer]\nname = "adamw"\nlr = 1e-3\nwarmup_steps = 0\n'
JOBS = {  # strategy text (None: examples/strategies/fsdp.toml), ranks, steps, --set values
    "gpt": (SINGLE.format(model="gpt"), 1, 6, [
        "model.n_layer=6", "model.d_model=512", "model.n_head=8", "model.seq_len=256", "model.vocab_size=256",
        "data.vocab_size=256", "job.global_batch=8", "job.threads=2"]),
    "llama": (SINGLE.format(model="llama"), 1, 6, [
        "model.n_layer=4", "model.d_model=256", "model.n_head=8", "model.n_kv_head=4", "model.seq_len=256", "model.vocab_size=4096",
        "data.vocab_size=4096", "job.global_batch=8", "job.threads=2"]),
    "fsdp_4": (None, 4, 4, [
        "parallel.data=4", "model.n_layer=16", "model.d_model=1024", "model.n_head=16", "model.seq_len=64", "optimizer.name=sgd",
        "optimizer.momentum=0", "job.global_batch=4", "job.threads=1", "pass.fsdp.reshard_after_forward=true"]),
}


def run(strata, job, mode):
    text, ranks, steps, sets = JOBS[job]
    sets = sets + [f"job.steps={steps}", "job.eval_every=0", "job.checkpoint_every=0", "job.checkpoint_at_end=false", "job.log_every=1",
                   f"job.host_memory={mode}"]
    with tempfile.TemporaryDirectory() as out:
        strategy = "examples/strategies/fsdp.toml"
        if text is not None:
            strategy = f"{out}/bench.toml"
            pathlib.Path(strategy).write_text(text)
        cmd = [strata, "run", strategy, "--out", f"{out}/run"] + (["-n", str(ranks)] if ranks > 1 else [])
        for s in sets:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        records = [json.loads(line) for line in pathlib.Path(f"{out}/run/metrics.jsonl").read_text().splitlines() if '"step"' in line]
    return {"ms": statistics.median(r["step_ms"] for r in records[1:]), "rss": max(r["mem_peak_bytes"] for r in records),
            "live": max(r["mem_device_peak_bytes"] for r in records), "losses": [r["loss"] for r in records]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--out", default="bench/results/host_memory_cpu.md")
    args = parser.parse_args()
    rows = []
    for job in args.jobs.split(","):
        runs = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for m in MODES:
                runs[m].append(run(args.strata, job, m))
        losses = {m: runs[m][0]["losses"] for m in MODES}
        if any(losses[m] != losses["keep"] for m in MODES):
            raise SystemExit(f"{job}: the losses differ between host_memory modes: {losses}")
        r = {m: {"ms": statistics.median(x["ms"] for x in runs[m]), "rss": max(x["rss"] for x in runs[m]),
                 "live": max(x["live"] for x in runs[m]), "by_round": [x["ms"] for x in runs[m]]} for m in MODES}
        rows.append((job, r))
        print(job, {m: (round(v["ms"]), round(v["rss"] / 2**20), round(v["live"] / 2**20)) for m, v in r.items()}, flush=True)

    mib = lambda b: f"{b / 2**20:.0f}"
    with open(args.out, "w") as f:
        f.write("# Host memory modes: step time and memory (CPU)\n\n")
        f.write(f"Command: `~/.local/share/strata/venv/bin/python bench/host_memory.py --rounds {args.rounds} --jobs {args.jobs}`  \n")
        f.write(f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared, noisy). The jobs and how they are measured: the "
                "script's docstring. Losses were equal in every mode.\n\n")
        f.write("| job | keep ms | return ms | cache ms | cache / keep | cache / return | keep RSS MiB | return RSS MiB "
                "| cache RSS MiB | live tensors MiB |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for job, r in rows:
            k, ret, c = r["keep"], r["return"], r["cache"]
            f.write(f"| {job} | {k['ms']:.0f} | {ret['ms']:.0f} | {c['ms']:.0f} | {c['ms'] / k['ms']:.3f} | {c['ms'] / ret['ms']:.3f} | "
                    f"{mib(k['rss'])} | {mib(ret['rss'])} | {mib(c['rss'])} | {mib(c['live'])} |\n")
        f.write("\nEach round's step time (ms), in the order they ran:\n\n| job | keep | return | cache |\n|---|---|---|---|\n")
        for job, r in rows:
            f.write(f"| {job} | " + " | ".join(", ".join(f"{x:.0f}" for x in r[m]["by_round"]) for m in MODES) + " |\n")
    print(open(args.out).read())


if __name__ == "__main__":
    main()
