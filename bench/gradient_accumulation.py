"""Gradient accumulation under the reduce-scattering passes: full gradients held through the step
(reduced once) vs each micro-batch's share reduce-scattered as it is computed, in Strata's fsdp
and zero2 (`reduce_every_micro_batch` false / true) and in PyTorch FSDP2
(`set_requires_gradient_sync(False)` on all but the last micro-batch / FSDP2's default), side by
side: peak RSS, bytes reduced, step time.

usage: python bench/gradient_accumulation.py [--strata build/bin/strata] [--rounds 2]
                                             [--out bench/results/gradient_accumulation_cpu.md]

Every configuration trains the same GPT (8 layers, d_model 512, seq 128, vocab 256, tied
embedding and head) for 3 steps of 4 micro-batches of one sequence per rank (global batch 4 x
ranks), AdamW, gradients clipped to 1, one thread per rank, at 2 and 4 ranks; each layer is an
fsdp unit (FSDP2: fully_shard on each block, then on the model); zero2's buckets are of
BUCKET_MB. Rounds are interleaved (every
configuration once per round); the table gives medians over rounds. Peak RSS is the process's
high-water mark (Strata's `mem_peak_bytes`, PyTorch's ru_maxrss), maximum over ranks; it
includes each framework's own baseline, so compare the two modes within a framework. Step time
is the median of steps 2 and 3 (rank 0). Strata's bytes reduced are `fsdp_reduce_bytes` /
`zero_reduce_bytes`.
"""
import argparse
import json
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from step_time import Gpt  # noqa: E402
from torch_ranks import run_ranks  # noqa: E402

N_LAYER, N_HEAD, D_MODEL, SEQ, VOCAB = 8, 8, 512, 128, 256
MICRO_BATCHES, STEPS = 4, 3
RANKS = [2, 4]
BUCKET_MB = 4  # zero2: a few buckets in flight are a small part of this model's 97 MiB of gradients
PASSES = ["fsdp", "zero2"]
STRATEGY = f"""
[job]
model = "gpt"
dataset = "synthetic"
steps = {STEPS}
global_batch = {{batch}}
micro_batch = 1
log_every = 100
eval_every = 0
checkpoint_every = 0
threads = 1
[model]
n_layer = {N_LAYER}
n_head = {N_HEAD}
d_model = {D_MODEL}
vocab_size = {VOCAB}
seq_len = {SEQ}
[data]
vocab_size = {VOCAB}
[[pass]]
name = "{{name}}"
reduce_every_micro_batch = {{every}}
{{keys}}"""


def strata_run(strata, work, name, ranks, every, round_):
    strategy = work / f"{name}_{ranks}_{every}.toml"
    keys = f"bucket_mb = {BUCKET_MB}\n" if name == "zero2" else ""
    strategy.write_text(STRATEGY.format(batch=MICRO_BATCHES * ranks, name=name, every="true" if every else "false", keys=keys))
    out = work / f"{name}_{ranks}_{every}_{round_}"
    subprocess.run([strata, "run", "-n", str(ranks), str(strategy), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"peak": records[-1]["mem_peak_bytes"], "reduced": records[-1]["fsdp_reduce_bytes" if name == "fsdp" else "zero_reduce_bytes"],
            "step_ms": statistics.median(r["step_ms"] for r in records[1:]), "loss": records[-1]["loss"]}


def torch_worker(rank, ranks, every, port, result):  # run_ranks' worker
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    torch.manual_seed(0)
    model = Gpt(N_LAYER, N_HEAD, D_MODEL, SEQ, vocab=VOCAB)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    data = torch.randint(VOCAB, (STEPS, MICRO_BATCHES, ranks, SEQ + 1))
    times = []
    for step in range(STEPS):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(MICRO_BATCHES):
            # FSDP2 reduce-scatters every backward unless told not to; "held" leaves all but the last unreduced.
            model.set_requires_gradient_sync(every or m == MICRO_BATCHES - 1)
            batch = data[step, m, rank:rank + 1]
            loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1)) / MICRO_BATCHES
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append((time.perf_counter() - start) * 1000)
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        result.put({"peak": peak.item(), "step_ms": statistics.median(times[1:])})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/results/gradient_accumulation_cpu.md")
    args = ap.parse_args()
    mib = 1024.0 * 1024.0
    frameworks = [f"strata {name}" for name in PASSES] + ["pytorch"]
    configs = [(f, r, e) for r in RANKS for f in frameworks for e in (False, True)]
    samples = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for framework, ranks, every in configs:
                figures = (run_ranks(torch_worker, ranks, ranks, every) if framework == "pytorch"
                           else strata_run(args.strata, pathlib.Path(tmp), framework.split()[1], ranks, every, round_))
                samples[(framework, ranks, every)].append(figures)
                print(round_, framework, ranks, every, figures, flush=True)

    def median(config, key):
        return statistics.median(s[key] for s in samples[config])

    # Full gradients of the layers (fp32): what holding them through the step costs at most.
    layer = 12 * D_MODEL * D_MODEL + 13 * D_MODEL
    layer_gradients = 4.0 * N_LAYER * layer
    names = {f"strata {name}": f"Strata {name}" for name in PASSES} | {"pytorch": "PyTorch FSDP2"}
    rows, reading = [], []
    for ranks in RANKS:
        for framework in frameworks:
            for every in (False, True):
                c = (framework, ranks, every)
                strata = framework != "pytorch"
                reduced = f"{median(c, 'reduced') / mib:.2f}" if strata else "-"
                loss = f"{samples[c][0]['loss']:.6f}" if strata else "-"
                mode = "each micro-batch reduced" if every else "held, reduced once"
                rows.append(f"| {names[framework]} | {ranks} | {mode} | {median(c, 'peak') / mib:.0f} | {reduced} | {median(c, 'step_ms'):.0f} | {loss} |")
        for framework in frameworks:
            held, every = (framework, ranks, False), (framework, ranks, True)
            line = (f"* {ranks} ranks, {names[framework]}: reducing every micro-batch changes peak RSS by "
                    f"{(median(every, 'peak') - median(held, 'peak')) / mib:+.0f} MiB "
                    f"and step time {median(every, 'step_ms') / median(held, 'step_ms'):.2f}x")
            if framework != "pytorch":
                line += f"; bytes reduced {median(every, 'reduced') / median(held, 'reduced'):.2f}x (formula: m = {MICRO_BATCHES})"
            reading.append(line + ".")
    lines = [f"# Gradient accumulation under fsdp and zero2: full gradients held vs reduced every micro-batch (CPU, {platform.processor() or platform.machine()})", "",
             f"Command: `~/.local/share/strata/venv/bin/python bench/gradient_accumulation.py --rounds {args.rounds}`.",
             f"GPT {N_LAYER} layers, d_model {D_MODEL}, seq {SEQ}, vocab {VOCAB}; {MICRO_BATCHES} micro-batches of 1 sequence per rank,",
             f"{STEPS} steps, AdamW, one thread per rank, gloo (PyTorch) and mpi (Strata) on one host; medians over {args.rounds} interleaved rounds.",
             f"zero2's buckets: {BUCKET_MB} MiB (its window holds two in flight and one filling).",
             "Peak RSS is the process's high-water mark, maximum over ranks (each framework's baseline differs: compare",
             "modes within a framework). Step time: median of steps 2 and 3.", "",
             f"Formula: holding the layers' full fp32 gradients through the step costs up to 4 x L x Ψ_layer = "
             f"{layer_gradients / mib:.0f} MiB per rank",
             "(less the units whose gradients are in flight either way, and the shares' chunk); reducing each micro-batch",
             "sends (m-1)(d-1)/d of the gradient bytes more per step.", "",
             "| pass | ranks | gradients between micro-batches | peak RSS MiB | reduced MiB per step | step ms | Strata loss at step 3 |",
             "|---|---|---|---|---|---|---|"] + rows + ["", "Reading:"] + reading + [
             "",
             "`fsdp_reduce_bytes` / `zero_reduce_bytes` count the full buffers the reduce-scatters reduced (a ring sends (d-1)/d of each). A peak RSS",
             "difference below the formula means the high-water mark was set where the held gradients are not all alive",
             "(the last backward frees them unit by unit). Why FSDP2's peak RSS rises when it reduces every micro-batch on",
             "gloo was not investigated; its absolute RSS includes the Python interpreter and the torch import.",
             "Step times are from oversubscribed ranks on a 2-core CPU and say nothing about a GPU or a network."]
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
