"""Training as users run it on a GPU: bf16 autocast, fused AdamW on fp32 master weights, flash
attention. Strata vs PyTorch eager vs torch.compile on the same model, data and optimizer.

usage (on a lent GPU, run by scripts/gpu_check):
  python3 bench/step_time_cuda_bf16.py --strata build/bin/strata --out bench/results/step_time_cuda_bf16.md
  python3 bench/step_time_cuda_bf16.py --device cpu --sizes tiny --steps 6 --warmup 2 --out /tmp/x.md   (a smoke test)

Models: GPT-2 124M (12 x 768, GPT-2's vocabulary 50257, seq 1024, batch 8) and a Llama of about
1B (18 x 2048, 16 query / 8 key-value heads, SwiGLU 5632, vocabulary 32000, seq 2048, batch 4).
Each loop: zero-grad, forward and loss under autocast(bf16) (loss in fp32), backward, clip to 1.0,
AdamW (lr 3e-4, betas 0.9/0.95, decay 0.1 on matrices; PyTorch: fused=True; Strata: its default
adamw_update.fused_cuda). The loss is read on the host every 10th step only (a logging step), as
Strata's loop does. Time: wall clock from the end of warm-up to the end of the last step (device
synchronised), so tokens/s counts what the GPU did. Strata: metrics.jsonl's step_ms, which on a
GPU is the wall time of a read window divided by its steps; the windows after warm-up are used.

Rounds interleave Strata, eager and compiled (a lent machine's speed drifts); the table takes the
median over rounds. torch.compile (mode "default") compiles once, before the first round, and its
compile time is reported apart. Eager and compiled share one model and optimizer (timing only),
so only one set of weights is resident.

MFU = tokens/s x FLOPs per token / peak, FLOPs per token = 6 N + 12 L H Q T (PaLM's; N counts
every parameter a matrix product uses: all but the position table and an untied input embedding;
the attention term counts the whole T x T score matrix, not half) and the peak bf16 dense figure
of the card from its name (H100 SXM and H200: 989 TFLOP/s).
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
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import step_time  # noqa: E402  (the same model classes as the fp32 bench)

# name, kind, n_layer, n_head, n_kv_head, d_model, seq_len, batch, vocab
SIZES = {
    "gpt2-124m": ("gpt", 12, 12, 12, 768, 1024, 8, 50257),
    # GPT-2 at batch 32 x 1024: MFU as llm.c-style runs report it (bigger GEMMs, the optimizer's
    # fixed time over 4x the tokens)
    "gpt2-124m-b32": ("gpt", 12, 12, 12, 768, 1024, 32, 50257),
    "llama-1b": ("llama", 18, 16, 8, 2048, 2048, 4, 32000),
    "tiny": ("gpt", 2, 2, 2, 64, 64, 2, 512),
    "tiny-llama": ("llama", 2, 4, 2, 64, 64, 2, 512),
}
LOG_EVERY = 10
PEAK_BF16_TFLOPS = [  # (substring of the device name, dense bf16 TFLOP/s), first match wins
    ("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0), ("L40S", 362.0), ("B200", 2250.0)]


def build(kind, n_layer, n_head, n_kv, d, seq, vocab):
    if kind == "gpt":
        return step_time.Gpt(n_layer, n_head, d, seq, vocab)
    return step_time.Llama(n_layer, n_head, d, seq, n_kv, vocab)


def matmul_parameters(model, kind):
    skip = {"wpe.weight"} if kind == "gpt" else {"wte.weight"}
    return sum(p.numel() for n, p in model.named_parameters() if n not in skip)


def flops_per_token(model, kind, n_layer, n_head, d, seq):
    return 6 * matmul_parameters(model, kind) + 12 * n_layer * n_head * (d // n_head) * seq


def peak_tflops(device):
    if device != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name()
    return next((p for key, p in PEAK_BF16_TFLOPS if key in name), None), name


def optimizer_for(model, device):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")


def train_step(forward, params, opt, batch, vocab, device):
    opt.zero_grad(set_to_none=True)
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = forward(x)
    loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def pytorch_run(forward, params, opt, data, vocab, device, steps, warmup):
    """tokens/s over steps warmup+1..steps and the allocator's peak (bytes) during the run."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for s in range(steps):
        if s == warmup:
            sync(device)
            start = time.perf_counter()
        loss = train_step(forward, params, opt, data[s % len(data)], vocab, device)
        if (s + 1) % LOG_EVERY == 0:
            loss.item()
    sync(device)
    elapsed = time.perf_counter() - start
    tokens = (steps - warmup) * data.shape[1] * (data.shape[2] - 1)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return tokens / elapsed, peak


def strata_run(strata, kind, n_layer, n_head, n_kv, d, seq, batch, vocab, device, steps, warmup, extra_passes=(), extra_sets=None):
    with tempfile.TemporaryDirectory() as work:
        out = str(pathlib.Path(work) / "run")
        strategy = pathlib.Path(work) / "bench.toml"
        text = f'[job]\nmodel = "{kind}"\ndataset = "synthetic"\n\n[[pass]]\nname = "amp"\ndtype = "bf16"\n'
        for entry in extra_passes:  # a pass's name, or (name, {key: TOML value})
            name, keys = (entry, {}) if isinstance(entry, str) else entry
            text += f'\n[[pass]]\nname = "{name}"\n' + "".join(f"{k} = {v}\n" for k, v in keys.items())
        strategy.write_text(text)
        sets = {
            "job.steps": steps, "job.global_batch": batch, "job.log_every": LOG_EVERY, "job.eval_every": 0,
            "job.checkpoint_every": 0, "job.device": f'"{device}"', "model.n_layer": n_layer, "model.n_head": n_head,
            "model.d_model": d, "model.seq_len": seq, "model.vocab_size": vocab, "data.vocab_size": vocab,
            "data.num_tokens": 1 << 22, "optimizer.lr": 3e-4, "optimizer.weight_decay": 0.1, "optimizer.warmup_steps": 0,
        }
        if kind == "llama":
            sets["model.n_kv_head"] = n_kv
        sets.update(extra_sets or {})
        cmd = [strata, "run", str(strategy), "--out", out]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"strata run failed ({done.returncode}): {done.stdout[-2000:]}")
        lines = [json.loads(l) for l in (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()]
        timed = [l for l in lines if l["step"] > warmup]
        mean_ms = statistics.fmean(l["step_ms"] for l in timed)
        peak = max(l.get("mem_device_peak_bytes", 0) for l in lines)
        reads = sum(l.get("host_reads", 0) for l in timed)
        return batch * seq / (mean_ms / 1000), peak, reads


def profile_kernels(forward, params, opt, data, vocab, device, path):
    """The device kernels of 5 steps by time (torch.profiler's self device time), as Markdown."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for s in range(5):
            train_step(forward, params, opt, data[s % len(data)], vocab, device)
        sync(device)
    wall_ms = (time.perf_counter() - start) * 1000 / 5
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0] if device == "cuda" else []
    rows.sort(key=lambda e: -e.self_device_time_total)
    busy = sum(e.self_device_time_total for e in rows) / 1000 / 5
    with open(path, "w") as f:
        f.write(f"# Device kernels of 5 steps ({pathlib.Path(path).stem})\n\n{sum(e.count for e in rows) / 5:.0f} kernels per step, "
                f"{busy:.2f} ms per step of device time, {wall_ms:.2f} ms per step of wall time (profiled).\n\n")
        f.write("| kernel | calls/step | ms/step | share of device time |\n|---|---|---|---|\n")
        for e in rows[:40]:
            name = e.key if len(e.key) <= 120 else e.key[:117] + "..."
            ms = e.self_device_time_total / 1000 / 5
            f.write(f"| `{name.replace('|', '/')}` | {e.count / 5:.1f} | {ms:.3f} | {100 * ms / busy:.1f}% |\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sizes", default="gpt2-124m,llama-1b")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10, help="steps before timing (a multiple of 10: Strata's read windows)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--variants", default="", help="comma-separated Strata loops to run (default: all for the device)")
    parser.add_argument("--profile", default="", help="a folder: each PyTorch loop's device kernels over 5 steps, as Strata's profile_steps")
    parser.add_argument("--out", default="bench/results/step_time_cuda_bf16.md")
    args = parser.parse_args()
    device = args.device
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32; bf16 comes from autocast
    peak, card = peak_tflops(device)
    rows, notes = [], []
    for size in args.sizes.split(","):
        kind, n_layer, n_head, n_kv, d, seq, batch, vocab = SIZES[size]
        torch.manual_seed(0)
        model = build(kind, n_layer, n_head, n_kv, d, seq, vocab).to(device)
        params = list(model.parameters())
        n_params = sum(p.numel() for p in params)
        fpt = flops_per_token(model, kind, n_layer, n_head, d, seq)
        opt = optimizer_for(model, device)
        data = torch.randint(vocab, (4, batch, seq + 1), device=device)
        loops = {"eager": model}
        compile_s = None
        if not args.no_compile:
            compiled = torch.compile(model)
            start = time.perf_counter()
            for s in range(3):  # compiles forward and backward
                train_step(compiled, params, opt, data[s % 4], vocab, device)
            sync(device)
            compile_s = time.perf_counter() - start
            loops["compile"] = compiled
        # The cuda_graph pass replays the forward and backward as one CUDA graph (CUDA only).
        variants = (("strata", (), {}), ("strata+fused_loss", ("fused_loss",), {}))
        if device == "cuda":
            variants += (("strata+cuda_graph", ("cuda_graph",), {}), ("strata+fused_loss+cuda_graph", ("fused_loss", "cuda_graph"), {}))
            if kind == "gpt":  # the bias gradients in the weight-gradient GEMMs (the Llama has no biases)
                # and the norms' outputs in bf16 (both opt-in: kernels/README.md)
                bgrad = ("module_replace", {"linear": '"linear.cublaslt_cuda"'})
                both = ("module_replace", {"linear": '"linear.cublaslt_cuda"', "layer_norm": '"layer_norm.autocast_out_cuda"'})
                # and the residual adds inside the norms (add_layer_norm.fused_cuda, also opt-in)
                all3 = ("module_replace", {"linear": '"linear.cublaslt_cuda"', "layer_norm": '"layer_norm.autocast_out_cuda"',
                                           "add_layer_norm": '"add_layer_norm.fused_cuda"'})
                variants += (("strata+fused_loss+cuda_graph+linear.cublaslt_cuda", ("fused_loss", "cuda_graph", bgrad), {}),
                             ("strata+fused_loss+cuda_graph+linear.cublaslt_cuda+layer_norm.autocast_out_cuda",
                              ("fused_loss", "cuda_graph", both), {}),
                             ("strata+fused_loss+cuda_graph+linear.cublaslt_cuda+layer_norm.autocast_out_cuda+add_layer_norm.fused_cuda",
                              ("fused_loss", "cuda_graph", all3), {}))
        if device == "cuda" and kind == "llama":  # q and k rotated in one kernel each way, norms out in bf16 (opt-in)
            rope = ("module_replace", {"rope": '"rope.fused_cuda"'})
            rope_rms = ("module_replace", {"rope": '"rope.fused_cuda"', "rms_norm": '"rms_norm.autocast_out_cuda"'})
            rope_rms_add = ("module_replace", {"rope": '"rope.fused_cuda"', "rms_norm": '"rms_norm.autocast_out_cuda"',
                                               "add_rms_norm": '"add_rms_norm.fused_cuda"'})
            variants += (("strata+fused_loss+cuda_graph+rope.fused_cuda", ("fused_loss", "cuda_graph", rope), {}),
                         ("strata+fused_loss+cuda_graph+rope.fused_cuda+rms_norm.autocast_out_cuda",
                          ("fused_loss", "cuda_graph", rope_rms), {}),
                         ("strata+fused_loss+cuda_graph+rope.fused_cuda+rms_norm.autocast_out_cuda+add_rms_norm.fused_cuda",
                          ("fused_loss", "cuda_graph", rope_rms_add), {}))
        if args.variants:
            wanted = args.variants.split(",")
            unknown = [w for w in wanted if w not in {name for name, _, _ in variants}]
            if unknown:
                sys.exit(f"--variants: no Strata loop {', '.join(unknown)} for {size} on {device} "
                         f"(loops: {', '.join(name for name, _, _ in variants)})")
            variants = tuple(v for v in variants if v[0] in wanted)
        measured = {**{name: [] for name, _, _ in variants}, **{k: [] for k in loops}}
        for r in range(args.rounds):
            if device == "cuda":
                torch.cuda.empty_cache()  # leave the card to the Strata process
            for name, passes, sets in variants:
                try:
                    tps, mem, reads = strata_run(args.strata, kind, n_layer, n_head, n_kv, d, seq, batch, vocab, device,
                                                 args.steps, args.warmup, passes, sets)
                    measured[name].append((tps, mem))
                    print(f"{size} round {r + 1} {name}: {tps:.0f} tok/s, peak {mem / 2**30:.2f} GiB, "
                          f"{reads:.0f} host reads in {args.steps - args.warmup} timed steps", flush=True)
                except RuntimeError as e:
                    notes.append(f"{size} {name} round {r + 1}: {e}")
                    print(notes[-1], flush=True)
            for name, forward in loops.items():
                tps, mem = pytorch_run(forward, params, opt, data, vocab, device, args.steps, args.warmup)
                measured[name].append((tps, mem))
                print(f"{size} round {r + 1} {name}: {tps:.0f} tok/s, peak {mem / 2**30:.2f} GiB", flush=True)
        if args.profile:
            for name, forward in loops.items():
                profile_kernels(forward, params, opt, data, vocab, device, f"{args.profile}/profile_{size}_{name}.md")
        base = {k: statistics.median(t for t, _ in v) for k, v in measured.items() if v}
        for name, runs in measured.items():
            if not runs:
                continue
            tps = base[name]
            mfu = f"{100 * tps * fpt / (peak * 1e12):.1f}%" if peak else "-"
            vs = lambda other: f"{tps / base[other]:.3f}x" if other in base else "-"
            rows.append((size, n_params, batch, seq, name, tps, mfu, max(m for _, m in runs) / 2**30, vs("eager"), vs("compile"),
                         " ".join(f"{t:.0f}" for t, _ in runs)))
        if compile_s is not None:
            notes.append(f"{size}: torch.compile's first three steps (compiling forward and backward) took {compile_s:.1f} s")
        del model, opt, loops, params
        if device == "cuda":
            torch.cuda.empty_cache()
        write(args, card, peak, rows, notes)


def write(args, card, peak, rows, notes):
    with open(args.out, "w") as f:
        f.write("# Step time on a GPU in bf16: Strata vs PyTorch eager vs torch.compile\n\n")
        f.write(f"Command: `python3 bench/step_time_cuda_bf16.py --steps {args.steps} --warmup {args.warmup} --rounds {args.rounds}"
                f" --sizes {args.sizes}" + (f" --variants {args.variants}" if args.variants else "") +
                "` (run by `scripts/gpu_check --prebuilt`)  \n")
        f.write(f"Device: {card}; peak bf16 dense {peak or 'unknown'} TFLOP/s; torch {torch.__version__}; "
                f"tokens/s over steps {args.warmup + 1}..{args.steps}, median of {args.rounds} interleaved rounds.\n\n")
        f.write("| model | params | batch | seq | loop | tokens/s | MFU | peak GiB | vs eager | vs compile | per round tokens/s |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
        for size, n, b, t, name, tps, mfu, mem, ve, vc, each in rows:
            f.write(f"| {size} | {n / 1e6:.1f} M | {b} | {t} | {name} | {tps:.0f} | {mfu} | {mem:.2f} | {ve} | {vc} | {each} |\n")
        if notes:
            f.write("\n" + "".join(f"* {n}\n" for n in notes))


if __name__ == "__main__":
    main()
