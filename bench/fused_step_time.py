"""Step time and peak memory of Strata with and without its fused kernels, next to PyTorch eager
and torch.compile on the same GPT-2, batch and optimizer, in one run (issue 19).

usage: python bench/fused_step_time.py [--strata build/bin/strata] [--steps 8] [--threads 2]
                                       [--sizes default,tiny,medium,vocab50257]
                                       [--out bench/results/fused_step_time_cpu.md]

Columns:
* Strata: `strata run` of the model (synthetic tokens, AdamW, clipping 1.0, fp32, one rank).
* Strata fused: the same with the fused_loss pass (output projection + cross entropy in chunks by
  linear_cross_entropy.chunked_cpu; the [tokens, vocab] logits never exist).
* eager / compile: bench/step_time.py's PyTorch GPT-2 and loop, plain and under torch.compile
  (default mode, inductor's C++ backend), each in its own process so peak RSS is its own.
Peak memory is the process's peak RSS (ru_maxrss) after the measured steps; the logits formula
N x V x 4 bytes (N = batch x seq tokens) is beside it: eager keeps about three such tensors
alive at the loss (logits, log-probabilities saved for backward, their gradient).
"""
import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {  # name: n_layer, n_head, d_model, seq_len, batch, vocab
    "default": (4, 4, 128, 128, 16, 256),
    "tiny": (4, 4, 128, 128, 16, 4096),
    "medium": (8, 8, 512, 256, 8, 4096),
    "vocab50257": (2, 4, 256, 256, 8, 50257),
}
WARMUP = 3


def pytorch_worker(spec):
    """Runs in a child process: median step ms and peak RSS of eager or compiled PyTorch."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import step_time
    n_layer, n_head, d, seq_len, batch, vocab = spec["size"]
    torch.set_num_threads(spec["threads"])
    torch.set_flush_denormal(True)
    step_time.VOCAB = vocab
    torch.manual_seed(0)
    model = step_time.Gpt(n_layer, n_head, d, seq_len)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    def loss_of(x, y):
        return F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))

    run = torch.compile(loss_of) if spec["compile"] else loss_of
    data = torch.randint(vocab, (spec["steps"], batch, seq_len + 1))
    times = []
    for s in range(spec["steps"]):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = run(data[s, :, :-1], data[s, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        times.append((time.perf_counter() - start) * 1000)
    print(json.dumps({"ms": statistics.median(times[WARMUP:]), "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def pytorch(size, steps, threads, compile_):
    spec = json.dumps({"size": size, "steps": steps, "threads": threads, "compile": compile_})
    out = subprocess.run([sys.executable, __file__, "--worker", spec], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def strata(binary, size, steps, threads, fused):
    n_layer, n_head, d, seq_len, batch, vocab = size
    with tempfile.TemporaryDirectory() as out:
        strategy = pathlib.Path(out) / "bench.toml"
        text = '[job]\nmodel = "gpt"\ndataset = "synthetic"\n'
        if fused:
            text += '\n[[pass]]\nname = "fused_loss"\n'
        strategy.write_text(text)
        sets = {
            "job.steps": steps, "job.global_batch": batch, "job.log_every": steps, "job.eval_every": 0,
            "job.checkpoint_every": 0, "job.threads": threads, "model.n_layer": n_layer, "model.n_head": n_head,
            "model.d_model": d, "model.seq_len": seq_len, "model.vocab_size": vocab, "data.vocab_size": vocab,
            "data.num_tokens": 1 << 20, "optimizer.lr": 1e-3, "optimizer.weight_decay": 0.1, "optimizer.warmup_steps": 0,
        }
        cmd = [binary, "run", str(strategy), "--out", out]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(l) for l in (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()]
        return {"ms": statistics.median(r["step_ms"] for r in records[WARMUP:]), "peak": records[-1]["mem_peak_bytes"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--out", default="bench/results/fused_step_time_cpu.md")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        return pytorch_worker(json.loads(args.worker))

    rows = []
    for name in args.sizes.split(","):
        size = SIZES[name]
        r = {
            "strata": strata(args.strata, size, args.steps, args.threads, False),
            "fused": strata(args.strata, size, args.steps, args.threads, True),
            "eager": pytorch(size, args.steps, args.threads, False),
            "compile": pytorch(size, args.steps, args.threads, True),
        }
        rows.append((name, size, r))
        print(name, {k: (round(v["ms"], 1), round(v["peak"] / 2**20)) for k, v in r.items()}, flush=True)

    mib = lambda b: f"{b / 2**20:.0f}"
    with open(args.out, "w") as f:
        f.write("# Step time and peak memory: Strata (with and without fused kernels) vs PyTorch eager and torch.compile (CPU, fp32)\n\n")
        f.write(f"Command: `~/.local/share/strata/venv/bin/python bench/fused_step_time.py --steps {args.steps} "
                f"--threads {args.threads} --sizes {args.sizes}`  \n")
        f.write(f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared, noisy); {args.threads} threads for all; "
                f"medians of steps {WARMUP + 1}..{args.steps}; one process each.\n\n")
        f.write("GPT-2 (tied head), random tokens, AdamW, clipping at 1.0. \"Strata fused\" adds the fused_loss pass "
                "(linear_cross_entropy.chunked_cpu). Ratios are time over PyTorch eager's (< 1: faster).\n\n")
        f.write("| size | layers x d_model | seq x batch | vocab | Strata ms | Strata fused ms | eager ms | compile ms "
                "| Strata / eager | fused / eager | compile / eager |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
        for name, (l, h, d, t, b, v), r in rows:
            e = r["eager"]["ms"]
            f.write(f"| {name} | {l} x {d} | {t} x {b} | {v} | {r['strata']['ms']:.1f} | {r['fused']['ms']:.1f} | {e:.1f} | "
                    f"{r['compile']['ms']:.1f} | {r['strata']['ms'] / e:.3f} | {r['fused']['ms'] / e:.3f} | {r['compile']['ms'] / e:.3f} |\n")
        f.write("\nPeak RSS (MiB) next to the logits formula N x V x 4 bytes:\n\n")
        f.write("| size | N x V x 4 (MiB) | Strata | Strata fused | eager | compile | Strata - fused |\n|---|---|---|---|---|---|---|\n")
        for name, (l, h, d, t, b, v), r in rows:
            f.write(f"| {name} | {mib(t * b * v * 4)} | {mib(r['strata']['peak'])} | {mib(r['fused']['peak'])} | "
                    f"{mib(r['eager']['peak'])} | {mib(r['compile']['peak'])} | {mib(r['strata']['peak'] - r['fused']['peak'])} |\n")
    print(open(args.out).read())


if __name__ == "__main__":
    main()
