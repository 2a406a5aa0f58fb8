"""Speed of one AGD optimizer step: Strata's fused agd_update vs its ATen reference vs an
AGD written in PyTorch eager (per-parameter torch ops, the usual way such optimizers ship),
with AdamW (Strata's plugin and torch.optim.AdamW foreach) for scale.

usage: python bench/agd_update.py [--build build] [--steps 30] [--threads 2] [--out bench/results/agd_update_cpu.md]

Parameters have the shapes of GPT-2 style models; every run takes the median of --steps
optimizer steps after 3 warm-up steps, on the same thread count.
"""
import argparse
import json
import math
import pathlib
import platform
import statistics
import subprocess
import time

import torch

SIZES = [  # name, n_layer, d_model, vocab, seq_len
    ("default model", 4, 128, 256, 128),
    ("medium", 8, 512, 4096, 256),
]


def gpt_shapes(layers, d, vocab, seq):
    shapes = [(vocab, d), (seq, d), (d,), (d,)]
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return shapes


class EagerAgd:
    """AGD from the formulas in docs/optimizers.md with torch ops, one parameter at a time."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.999), delta=1e-5, weight_decay=0.1):
        self.params, self.lr, self.b1, self.b2, self.delta, self.wd = params, lr, *betas, delta, weight_decay
        self.m = [torch.zeros_like(p) for p in params]
        self.b = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        c1, c1p, c2 = 1 - self.b1 ** self.t, 1 - self.b1 ** (self.t - 1), 1 - self.b2 ** self.t
        for p, m, b in zip(self.params, self.m, self.b):
            p.mul_(1 - self.lr * self.wd)
            m_prev = m.clone()
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            s = m / c1 if self.t == 1 else m / c1 - m_prev / c1p
            b.mul_(self.b2).addcmul_(s, s, value=1 - self.b2)
            d = b.sqrt().clamp_(min=self.delta * math.sqrt(c2))
            p.addcdiv_(m, d, value=-self.lr * math.sqrt(c2) / c1)


def median_ms(step, steps):
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def pytorch_runs(shapes, steps):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape) * 1e-3
    agd = EagerAgd(params)
    adamw = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True)
    return {"PyTorch eager AGD (per-parameter ops)": median_ms(agd.step, steps),
            "torch.optim.AdamW (foreach)": median_ms(adamw.step, steps)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/agd_update_cpu.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    driver = pathlib.Path(args.build) / "bin" / "strata_bench_agd_update"
    lines = [f"# One AGD optimizer step on CPU ({platform.machine()}, {args.threads} threads, fp32)", "",
             f"Command: `~/.local/share/strata/venv/bin/python bench/agd_update.py --steps {args.steps} --threads {args.threads}`.",
             "Median of the optimizer-step times after 3 warm-up steps; weight decay 0.1 on every tensor.", ""]
    for name, layers, d, vocab, seq in SIZES:
        out = subprocess.run([str(driver), str(layers), str(d), str(vocab), str(seq), str(args.steps), str(args.threads)],
                             check=True, capture_output=True, text=True).stdout
        rows = [json.loads(line) for line in out.splitlines()]
        timings = {r["impl"]: r["median_ms"] for r in rows}
        timings.update(pytorch_runs(gpt_shapes(layers, d, vocab, seq), args.steps))
        fused = timings["agd fused"]
        lines += [f"## {name}: {rows[0]['params'] / 1e6:.2f}M parameters in {rows[0]['tensors']} tensors", "",
                  "| implementation | median ms/step | vs Strata fused AGD |", "|---|---|---|"]
        for impl, ms in timings.items():
            lines.append(f"| {impl} | {ms:.2f} | {ms / fused:.2f}x |")
        lines.append("")
    pathlib.Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
