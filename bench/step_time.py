"""Step time of Strata vs PyTorch eager on the same GPT-2 model, batch and optimizer.

usage: python bench/step_time.py [--strata build/bin/strata] [--steps 20] [--out bench/results/step_time_cpu.md]
       python bench/step_time.py --device cuda --out bench/results/step_time_cuda.md   (on a GPU: scripts/gpu_check)

For each size it runs `strata run` (synthetic tokens, AdamW, grad clipping 1.0, fp32) and an
equivalent PyTorch eager training loop written here (torch.optim.AdamW with its default
foreach implementation, clip_grad_norm_), both with the same thread count, and reports the
median step time of the steps after warmup, the tokens per second and the ratio.
"""
import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = [  # name, n_layer, n_head, d_model, seq_len, batch
    ("tiny", 4, 4, 128, 128, 16),
    ("small", 6, 6, 384, 256, 8),
    ("medium", 8, 8, 512, 256, 8),
]
# On a GPU the small sizes measure launch overhead; GPT-2 small (124 M at vocab 50257) measures the kernels.
CUDA_SIZES = SIZES + [("gpt2-small", 12, 12, 768, 1024, 8)]
VOCAB = 4096
WARMUP = 3
LOG_EVERY = 10  # on a GPU: steps between reads of the loss (Strata's and PyTorch's loops alike)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, -1)
        heads = lambda y: y.view(b, t, self.h, d // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, n_layer, n_head, d, seq_len, vocab=VOCAB):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


class LlamaBlock(nn.Module):
    """Strata's llama block (plugins/models/llama.cpp): RMSNorm, grouped-query attention with
    rotate-half RoPE, SwiGLU of Llama's width (2/3 of 4 d, a multiple of 256), no biases."""

    def __init__(self, d, h, kv, seq_len, theta=10000.0):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        hidden = (8 * d // 3 + 255) // 256 * 256
        self.attn_norm, self.mlp_norm = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.q, self.k = nn.Linear(d, d, bias=False), nn.Linear(d, kv * self.hd, bias=False)
        self.v, self.o = nn.Linear(d, kv * self.hd, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        freqs = theta ** (-torch.arange(0, self.hd, 2).float() / self.hd)
        angles = torch.outer(torch.arange(seq_len).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rope(self, x):
        t, half = x.shape[2], self.hd // 2
        c, s = self.cos[:t], self.sin[:t]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(self, x):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q = self.rope(self.q(h).view(b, t, self.h, self.hd).transpose(1, 2))
        k = self.rope(self.k(h).view(b, t, self.kv, self.hd).transpose(1, 2))
        v = self.v(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, n_layer, n_head, d, seq_len, n_kv_head, vocab=VOCAB):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, n_head, n_kv_head, seq_len) for _ in range(n_layer))
        self.norm, self.head = nn.RMSNorm(d, eps=1e-5), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def eager_step(model, opt, batch, read=True):
    """One PyTorch eager training step on batch [B, T + 1]: loss, backward, clip to 1, AdamW;
    the loss read on the host when `read` (which on a GPU waits for the step to finish)."""
    opt.zero_grad(set_to_none=True)
    x, y = batch[:, :-1], batch[:, 1:]
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if read:
        loss.item()


def pytorch_step_times(n_layer, n_head, d, seq_len, batch, steps, flush_denormal, device="cpu"):
    torch.set_flush_denormal(flush_denormal)
    torch.manual_seed(0)
    model = Gpt(n_layer, n_head, d, seq_len).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    data = torch.randint(VOCAB, (steps, batch, seq_len + 1), device=device)
    times = []
    if device == "cuda":
        # As Strata's loop on a GPU: the loss is read every LOG_EVERY steps, each step of a window
        # is given the window's mean wall time.
        for first in range(0, steps, LOG_EVERY):
            n = min(LOG_EVERY, steps - first)
            start = time.perf_counter()
            for s in range(first, first + n):
                eager_step(model, opt, data[s], read=s == first + n - 1)
            times += [(time.perf_counter() - start) * 1000 / n] * n
        return times
    for s in range(steps):
        start = time.perf_counter()
        eager_step(model, opt, data[s])
        times.append((time.perf_counter() - start) * 1000)
    return times


def strata_step_times(strata, n_layer, n_head, d, seq_len, batch, steps, threads, device="cpu"):
    with tempfile.TemporaryDirectory() as work:
        out = str(pathlib.Path(work) / "run")  # strata refuses a run directory holding other files
        sets = {
            "job.model": "gpt", "job.dataset": "synthetic", "job.steps": steps, "job.global_batch": batch,
            "job.log_every": LOG_EVERY if device == "cuda" else steps, "job.eval_every": 0, "job.checkpoint_every": 0, "job.threads": threads,
            "model.n_layer": n_layer, "model.n_head": n_head, "model.d_model": d, "model.seq_len": seq_len,
            "model.vocab_size": VOCAB, "data.vocab_size": VOCAB, "data.num_tokens": 1 << 20,
            "optimizer.lr": 1e-3, "optimizer.weight_decay": 0.1, "optimizer.warmup_steps": 0,
            "job.device": f'"{device}"',
        }
        strategy = pathlib.Path(work) / "bench.toml"
        strategy.write_text('[job]\nmodel = "gpt"\ndataset = "synthetic"\n')
        cmd = [strata, "run", str(strategy), "--out", out]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        lines = (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()
        # checkpoint at the last step is outside step_ms, which covers forward to optimizer step
        return [json.loads(l)["step_ms"] for l in lines]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="bench/results/step_time_cpu.md")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=1, help="cuda: interleaved rounds (each size: Strata, then PyTorch)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        return main_cuda(args)

    rows = []
    for name, n_layer, n_head, d, seq_len, batch in SIZES:
        s = strata_step_times(args.strata, n_layer, n_head, d, seq_len, batch, args.steps, args.threads)[WARMUP:]
        p = pytorch_step_times(n_layer, n_head, d, seq_len, batch, args.steps, True)[WARMUP:]
        p_default = pytorch_step_times(n_layer, n_head, d, seq_len, batch, args.steps, False)[WARMUP:]
        params = sum(x.numel() for x in Gpt(n_layer, n_head, d, seq_len).parameters())
        ms, mp, mpd = statistics.median(s), statistics.median(p), statistics.median(p_default)
        rows.append((name, n_layer, d, seq_len, batch, params, ms, mp, mpd, batch * seq_len / ms * 1000, batch * seq_len / mp * 1000))
        print(f"{name}: strata {ms:.1f} ms, pytorch {mp:.1f} ms (flush denormals), {mpd:.1f} ms (default), "
              f"ratio {ms / mp:.3f}", flush=True)

    with open(args.out, "w") as f:
        f.write("# Step time: Strata vs PyTorch eager (CPU, fp32)\n\n")
        f.write(f"Command: `{STRATA_VENV_PY} bench/step_time.py --steps {args.steps} --threads {args.threads}`  \n")
        f.write(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}; "
                f"{args.threads} threads for both; medians of steps {WARMUP + 1}..{args.steps}.\n\n")
        f.write("Same GPT-2 model (tied head, vocab 4096), random tokens, AdamW (lr 1e-3, betas 0.9/0.95, decay 0.1 on "
                "Linear weights), gradient clipping at 1.0. A step is zero-grad, forward, loss, backward, clip, "
                "optimizer step.\n\n")
        f.write("Strata flushes denormal floats to zero on the CPU; the PyTorch column does the same "
                "(`torch.set_flush_denormal(True)`) so that the comparison is like for like. PyTorch with its "
                "default (denormals kept) is shown too.\n\n")
        f.write("| size | layers | d_model | seq | batch | params | Strata ms/step | PyTorch ms/step | PyTorch default ms/step | Strata tok/s | PyTorch tok/s | Strata / PyTorch time |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for name, l, d, t, b, n, ms, mp, mpd, ts, tp in rows:
            f.write(f"| {name} | {l} | {d} | {t} | {b} | {n / 1e6:.2f} M | {ms:.1f} | {mp:.1f} | {mpd:.1f} | {ts:.0f} | {tp:.0f} | {ms / mp:.3f} |\n")


def main_cuda(args):
    """The same comparison on one GPU, fp32 (TF32 off in both, their defaults), no denormal columns.
    Rounds interleave the two loops (a lent machine's host speed drifts); each round's median of
    steps WARMUP+1.. per column, then the median over rounds, and the median of the per-round ratios."""
    per_round = {name: [] for name, *_ in CUDA_SIZES}
    for r in range(args.rounds):
        for name, n_layer, n_head, d, seq_len, batch in CUDA_SIZES:
            s = strata_step_times(args.strata, n_layer, n_head, d, seq_len, batch, args.steps, args.threads, "cuda")[WARMUP:]
            p = pytorch_step_times(n_layer, n_head, d, seq_len, batch, args.steps, False, "cuda")[WARMUP:]
            ms, mp = statistics.median(s), statistics.median(p)
            per_round[name].append((ms, mp))
            print(f"round {r + 1} {name}: strata {ms:.2f} ms, pytorch {mp:.2f} ms, ratio {ms / mp:.3f}", flush=True)
    rows = []
    for name, n_layer, n_head, d, seq_len, batch in CUDA_SIZES:
        pairs = per_round[name]
        params = sum(x.numel() for x in Gpt(n_layer, n_head, d, seq_len).parameters())
        rows.append((name, n_layer, d, seq_len, batch, params, statistics.median(m for m, _ in pairs),
                     statistics.median(p for _, p in pairs), statistics.median(m / p for m, p in pairs),
                     " ".join(f"{m / p:.3f}" for m, p in pairs)))
    with open(args.out, "w") as f:
        f.write("# Step time: Strata vs PyTorch eager (CUDA, fp32)\n\n")
        f.write(f"Command: `python3 bench/step_time.py --device cuda --steps {args.steps} --rounds {args.rounds} --out {args.out}` "
                "(run by scripts/gpu_check)  \n")
        f.write(f"Machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; per round the median of steps "
                f"{WARMUP + 1}..{args.steps}, then the median of {args.rounds} interleaved round(s). Same model, data and "
                f"optimizer as the CPU table (step_time_cpu.md); both loops read the loss every {LOG_EVERY} steps and give each "
                "step of such a window its mean wall time (Strata: step_ms; PyTorch: the same, loss.item() ending the window).\n\n")
        f.write("| size | layers | d_model | seq | batch | params | Strata ms/step | PyTorch ms/step | Strata / PyTorch time (median of rounds) | per round |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|\n")
        for name, l, d, t, b, n, ms, mp, ratio, each in rows:
            f.write(f"| {name} | {l} | {d} | {t} | {b} | {n / 1e6:.2f} M | {ms:.2f} | {mp:.2f} | {ratio:.3f} | {each} |\n")


STRATA_VENV_PY = "~/.local/share/strata/venv/bin/python"

if __name__ == "__main__":
    main()
