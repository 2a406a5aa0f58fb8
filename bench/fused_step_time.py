"""Step time and peak memory of Strata (reference operators, its defaults with fused kernels, and
with fused_loss) next to PyTorch eager and torch.compile on the same GPT-2, batch and optimizer,
in one run with interleaved rounds (issue 33); the size "llama" is Strata's llama (RMSNorm, grouped-query
attention with RoPE, SwiGLU) against the same architecture written in PyTorch (bench/step_time.py).

usage: python bench/fused_step_time.py [--strata build/bin/strata] [--steps 8] [--rounds 3]
                                       [--threads 2] [--sizes default,tiny,small,medium,vocab50257]
                                       [--out bench/results/fused_step_time_cpu.md] [--append]

Columns:
* Strata reference: `strata run` of the model (synthetic tokens, AdamW, clipping 1.0, fp32, one
  rank) with module_replace choosing the reference attention, linear, gelu (Llama: swiglu and rms_norm) and
  adamw_update (the ATen calls eager makes).
* Strata: the defaults (attention.fused_cpu, linear.onednn_cpu, gelu.fused_cpu by priority).
* + fused_loss: also the output projection + cross entropy in chunks
  (linear_cross_entropy.chunked_cpu; the [tokens, vocab] logits never exist).
* eager / compile: bench/step_time.py's PyTorch GPT-2 and loop, plain and under torch.compile
  (default mode, inductor's C++ backend), each in its own process so peak RSS is its own.
Peak memory: Strata's mem_peak_bytes, PyTorch's process peak RSS (ru_maxrss); the logits formula
N x V x 4 bytes (N = batch x seq tokens) is beside it: eager keeps about three such tensors alive
at the loss (logits, log-probabilities saved for backward, their gradient).
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
    "small": (6, 6, 384, 256, 8, 4096),
    "medium": (8, 8, 512, 256, 8, 4096),
    "vocab50257": (2, 4, 256, 256, 8, 50257),
    "llama": (4, 8, 256, 256, 8, 4096),  # Strata's llama: RMSNorm, GQA (n_kv_head = n_head / 2), RoPE, SwiGLU
}
LLAMA_SIZES = {"llama"}


def cpu_description(strata_bin):
    """The CPU model, its ISA features and the limits set on ATen and oneDNN, as `strata ops` reads
    them (every column of a run shares the environment, so the limits apply to PyTorch too)."""
    listing = subprocess.run([strata_bin, "ops"], capture_output=True, text=True).stdout
    line = next((l for l in listing.splitlines() if l.startswith("CPU paths on this machine (")), "")
    described = line[len("CPU paths on this machine ("):-1] if line else platform.machine()
    limits = [f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "STRATA_CPU_FALLBACK") if k in os.environ]
    return described + (f" (environment: {', '.join(limits)})" if limits else "")


def model_of(name):
    return "llama" if name in LLAMA_SIZES else "gpt"
WARMUP = 3


def pytorch_setup(spec):
    """The PyTorch side of one column: a function running training step s (0 <= s < spec["steps"])
    of the model, eager or compiled. bench/profile_cpu.py profiles the same step."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import step_time
    n_layer, n_head, d, seq_len, batch, vocab = spec["size"]
    torch.set_num_threads(spec["threads"])
    torch.set_flush_denormal(True)
    step_time.VOCAB = vocab
    torch.manual_seed(0)
    if spec["model"] == "llama":
        model = step_time.Llama(n_layer, n_head, d, seq_len, n_head // 2)
    else:
        model = step_time.Gpt(n_layer, n_head, d, seq_len)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    def loss_of(x, y):
        return F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))

    run = torch.compile(loss_of) if spec["compile"] else loss_of
    data = torch.randint(vocab, (spec["steps"], batch, seq_len + 1))

    def step(s):
        opt.zero_grad(set_to_none=True)
        loss = run(data[s, :, :-1], data[s, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()

    return step


def pytorch_worker(spec):
    """Runs in a child process: median step ms and peak RSS of eager or compiled PyTorch."""
    step = pytorch_setup(spec)
    times = []
    for s in range(spec["steps"]):
        start = time.perf_counter()
        step(s)
        times.append((time.perf_counter() - start) * 1000)
    print(json.dumps({"ms": statistics.median(times[WARMUP:]), "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


# glibc's malloc set as Strata's [job] host_memory = "keep" sets it (core/src/host/host_memory.cpp),
# for the "eager (keep)" column: what that setting alone gives PyTorch.
KEEP_HOST_MEMORY = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"


def pytorch(model, size, steps, threads, compile_, keep=False):
    spec = json.dumps({"model": model, "size": size, "steps": steps, "threads": threads, "compile": compile_})
    env = dict(os.environ, GLIBC_TUNABLES=KEEP_HOST_MEMORY) if keep else None
    out = subprocess.run([sys.executable, __file__, "--worker", spec], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


STRATA_VARIANTS = {  # column: passes added to the strategy ({activation}: gelu, or swiglu and rms_norm for a Llama)
    "reference": '\n[[pass]]\nname = "module_replace"\nattention = "reference"\nlinear = "reference"\n{activation}adamw_update = "reference"\ncross_entropy = "reference"\n',
    "strata": "",
    "strata_return": 'host_memory = "return"\n',  # glibc's malloc defaults, the host memory setting's A/B
    "fused_loss": '\n[[pass]]\nname = "fused_loss"\n',
}


def strata_command(binary, model, size, steps, threads, variant, out):
    """`strata run` of one column into out/run (its strategy written to out/bench.toml)."""
    n_layer, n_head, d, seq_len, batch, vocab = size
    strategy = pathlib.Path(out) / "bench.toml"
    activation = 'swiglu = "reference"\nrms_norm = "reference"\n' if model == "llama" else 'gelu = "reference"\n'
    strategy.write_text(f'[job]\nmodel = "{model}"\ndataset = "synthetic"\n' + STRATA_VARIANTS[variant].replace("{activation}", activation)
                        + (f"\n[model]\nn_kv_head = {n_head // 2}\n" if model == "llama" else ""))
    sets = {
        "job.steps": steps, "job.global_batch": batch, "job.log_every": steps, "job.eval_every": 0,
        "job.checkpoint_every": 0, "job.threads": threads, "model.n_layer": n_layer, "model.n_head": n_head,
        "model.d_model": d, "model.seq_len": seq_len, "model.vocab_size": vocab, "data.vocab_size": vocab,
        "data.num_tokens": 1 << 20, "optimizer.lr": 1e-3, "optimizer.weight_decay": 0.1, "optimizer.warmup_steps": 0,
    }
    run_dir = pathlib.Path(out) / "run"  # strata run refuses a directory holding other files
    cmd = [binary, "run", str(strategy), "--out", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd, run_dir


def strata(binary, model, size, steps, threads, variant):
    with tempfile.TemporaryDirectory() as out:
        cmd, run_dir = strata_command(binary, model, size, steps, threads, variant, out)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {"ms": statistics.median(r["step_ms"] for r in records[WARMUP:]), "peak": records[-1]["mem_peak_bytes"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/fused_step_time_cpu.md")
    parser.add_argument("--append", action="store_true", help="add this thread count's section to --out")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        return pytorch_worker(json.loads(args.worker))

    # Interleaved rounds: every column once per round, in turn, so that the machine's drift
    # (shared, noisy) spreads over all of them; the median over rounds of each run's median.
    columns = list(STRATA_VARIANTS) + ["eager", "eager_keep", "compile"]
    rows = []
    for name in args.sizes.split(","):
        size = SIZES[name]
        runs = {c: [] for c in columns}
        for _ in range(args.rounds):
            for c in columns:
                if c in STRATA_VARIANTS:
                    runs[c].append(strata(args.strata, model_of(name), size, args.steps, args.threads, c))
                else:
                    runs[c].append(pytorch(model_of(name), size, args.steps, args.threads, c == "compile", c == "eager_keep"))
        r = {c: {"ms": statistics.median(x["ms"] for x in runs[c]), "peak": max(x["peak"] for x in runs[c])} for c in columns}
        # Each round's own Strata / eager and Strata / compile: how far the medians' ratio moves with the machine.
        by_round = [(s["ms"] / e["ms"], s["ms"] / c["ms"]) for s, e, c in zip(runs["strata"], runs["eager"], runs["compile"])]
        rows.append((name, size, r, by_round))
        print(name, {k: (round(v["ms"], 1), round(v["peak"] / 2**20)) for k, v in r.items()}, flush=True)

    mib = lambda b: f"{b / 2**20:.0f}"
    with open(args.out, "a" if args.append else "w") as f:
        if not args.append:
            f.write("# Step time and peak memory: Strata vs PyTorch eager and torch.compile (CPU, fp32)\n\n")
            f.write("GPT-2 (tied head, tanh GELU), random tokens, AdamW, clipping at 1.0; the same model and loop in all "
                    "columns. Strata reference: the reference operators (`module_replace` with attention, linear, gelu, adamw_update and cross_entropy = "
                    "\"reference\": the ATen calls eager makes); Strata: the defaults (fused CPU kernels chosen by "
                    "priority; host memory kept for reuse, [job] host_memory = \"keep\"); Strata (return): the same with host_memory = "
                    "\"return\" (glibc's malloc defaults); + fused_loss: also the chunked "
                    "linear + cross-entropy. eager (keep): eager under the glibc malloc settings host_memory = \"keep\" makes "
                    "(GLIBC_TUNABLES). Ratios are time over PyTorch eager's (< 1: faster).\n")
        f.write(f"\n## {args.threads} thread(s)\n\nCommand: `~/.local/share/strata/venv/bin/python bench/fused_step_time.py "
                f"--steps {args.steps} --rounds {args.rounds} --threads {args.threads} --sizes {args.sizes}"
                f"{' --append' if args.append else ''}`  \n")
        f.write(f"Machine: {cpu_description(args.strata)}, {os.cpu_count()} cores (shared, noisy); {args.threads} threads for all; "
                f"each run's median of steps {WARMUP + 1}..{args.steps}, then the median of {args.rounds} interleaved "
                "rounds; one process each.\n\n")
        f.write("| size | layers x d_model | seq x batch | vocab | Strata reference ms | Strata ms | Strata (return) ms | + fused_loss ms "
                "| eager ms | eager (keep) ms | compile ms | Strata / eager | Strata / compile | Strata / Strata (return) "
                "| + fused_loss / eager | eager (keep) / eager | compile / eager |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for name, (l, h, d, t, b, v), r, _ in rows:
            e, k, c, m = r["eager"]["ms"], r["eager_keep"]["ms"], r["compile"]["ms"], r["strata"]["ms"]
            ret = r["strata_return"]["ms"]
            f.write(f"| {name} | {l} x {d} | {t} x {b} | {v} | {r['reference']['ms']:.1f} | {m:.1f} | {ret:.1f} | {r['fused_loss']['ms']:.1f} | "
                    f"{e:.1f} | {k:.1f} | {c:.1f} | {m / e:.3f} | {m / c:.3f} | {m / ret:.3f} | {r['fused_loss']['ms'] / e:.3f} | {k / e:.3f} | "
                    f"{c / e:.3f} |\n")
        f.write("\nEach round's Strata / eager and Strata / compile (the rounds are interleaved, so a round's ratio is "
                "one like-for-like comparison; the table's ratios are of the medians):\n\n| size | Strata / eager by round | "
                "Strata / compile by round |\n|---|---|---|\n")
        for name, _, _, by_round in rows:
            f.write(f"| {name} | {', '.join(f'{e:.3f}' for e, _ in by_round)} | {', '.join(f'{c:.3f}' for _, c in by_round)} |\n")
        f.write("\nPeak memory (MiB; Strata: its mem_peak_bytes, PyTorch: the process's peak RSS) next to the logits "
                "formula N x V x 4 bytes:\n\n")
        f.write("| size | N x V x 4 | Strata | + fused_loss | eager | eager (keep) | compile |\n|---|---|---|---|---|---|---|\n")
        for name, (l, h, d, t, b, v), r, _ in rows:
            f.write(f"| {name} | {mib(t * b * v * 4)} | {mib(r['strata']['peak'])} | {mib(r['fused_loss']['peak'])} | "
                    f"{mib(r['eager']['peak'])} | {mib(r['eager_keep']['peak'])} | {mib(r['compile']['peak'])} |\n")
    print(open(args.out).read())


if __name__ == "__main__":
    main()
