"""2-rank data parallel: Strata's ddp pass (mpi backend) vs PyTorch DistributedDataParallel (gloo).

usage: python bench/ddp_step_time.py [--strata build/bin/strata] [--steps 30] [--out bench/results/ddp_cpu.md]

Same GPT-2 model, global batch, AdamW and clipping as bench/step_time.py; one thread per rank;
denormals flushed on both sides; gradient buckets of 4 MiB on both sides. Also runs Strata with a
single bucket that can only start after backward ends, whose exposed wait is the whole
all-reduce time; the share of communication hidden behind backward is then
1 - exposed(bucketed) / exposed(single bucket).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from step_time import VOCAB, Gpt  # noqa: E402
from torch_ranks import run_ranks  # noqa: E402

N_LAYER, N_HEAD, D_MODEL, SEQ, GLOBAL_BATCH, BUCKET_MB, WARMUP = 4, 4, 256, 128, 16, 4, 5


def strata_run(strata, steps, bucket_mb):
    with tempfile.TemporaryDirectory() as out:
        strategy = pathlib.Path(out) / "ddp.toml"
        strategy.write_text('[job]\nmodel = "gpt"\ndataset = "synthetic"\n\n[[pass]]\nname = "ddp"\n')
        sets = {"job.steps": steps, "job.global_batch": GLOBAL_BATCH, "job.log_every": steps, "job.eval_every": 0,
                "job.checkpoint_every": 0, "job.threads": 1, "model.n_layer": N_LAYER, "model.n_head": N_HEAD,
                "model.d_model": D_MODEL, "model.seq_len": SEQ, "model.vocab_size": VOCAB, "data.vocab_size": VOCAB,
                "optimizer.lr": 1e-3, "optimizer.weight_decay": 0.1, "pass.ddp.bucket_mb": bucket_mb}
        cmd = [strata, "run", "-n", "2", str(strategy), "--out", out]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(l) for l in (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()][WARMUP:]
        return statistics.median(r["step_ms"] for r in rows), statistics.median(r["ddp_exposed_comm_ms"] for r in rows)


def torch_worker(rank, steps, port, result):
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Gpt(N_LAYER, N_HEAD, D_MODEL, SEQ), bucket_cap_mb=BUCKET_MB)
    named = list(model.module.named_parameters())
    decay = [p for n, p in named if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in named if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    local = GLOBAL_BATCH // 2
    data = torch.randint(VOCAB, (steps, GLOBAL_BATCH, SEQ + 1))
    times = []
    for s in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        batch = data[s, rank * local:(rank + 1) * local]
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # Strata reduces the logged loss too
        times.append((time.perf_counter() - start) * 1000)
    if rank == 0:
        result.put(statistics.median(times[WARMUP:]))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="bench/results/ddp_cpu.md")
    args = parser.parse_args()
    strata_ms, exposed = strata_run(args.strata, args.steps, BUCKET_MB)
    single_ms, exposed_single = strata_run(args.strata, args.steps, 1000)
    torch_ms = run_ranks(torch_worker, 2, args.steps)
    hidden = 1 - exposed / exposed_single if exposed_single > 0 else float("nan")
    params = sum(p.numel() for p in Gpt(N_LAYER, N_HEAD, D_MODEL, SEQ).parameters())
    print(f"strata {strata_ms:.1f} ms (exposed comm {exposed:.2f} ms), single bucket {single_ms:.1f} ms "
          f"(exposed {exposed_single:.2f} ms), pytorch ddp gloo {torch_ms:.1f} ms, hidden {hidden:.0%}")
    with open(args.out, "w") as f:
        f.write("# 2-rank data parallel step time: Strata ddp (mpi) vs PyTorch DDP (gloo), CPU\n\n")
        f.write(f"Command: `~/.local/share/strata/venv/bin/python bench/ddp_step_time.py --steps {args.steps}`  \n")
        f.write(f"Machine: {os.cpu_count()} cores, 2 ranks with 1 thread each; torch {torch.__version__}; medians of steps "
                f"{WARMUP + 1}..{args.steps}.\n\n")
        f.write(f"GPT-2 model: {N_LAYER} layers, d_model {D_MODEL}, seq {SEQ}, vocab {VOCAB}, {params / 1e6:.2f} M parameters; "
                f"global batch {GLOBAL_BATCH} ({GLOBAL_BATCH // 2} per rank); AdamW, clipping 1.0; {BUCKET_MB} MiB buckets.\n\n")
        f.write("| run | ms/step | exposed communication ms/step |\n|---|---|---|\n")
        f.write(f"| Strata ddp, {BUCKET_MB} MiB buckets | {strata_ms:.1f} | {exposed:.2f} |\n")
        f.write(f"| Strata ddp, one bucket (no overlap possible) | {single_ms:.1f} | {exposed_single:.2f} |\n")
        f.write(f"| PyTorch DDP, gloo, {BUCKET_MB} MiB buckets | {torch_ms:.1f} | - |\n\n")
        f.write(f"Strata / PyTorch step time: {strata_ms / torch_ms:.3f}. Share of all-reduce time hidden behind "
                f"backward: {hidden:.0%} (1 - exposed with buckets / exposed with one bucket).\n")


if __name__ == "__main__":
    main()
