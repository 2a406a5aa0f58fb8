"""fp32 GEMMs of a Linear layer on the CPU: MKL (what PyTorch eager and Strata call: torch.mm /
addmm with transposes as flags) against oneDNN (torch.ops.mkldnn._linear_pointwise with the weight
reordered into oneDNN's blocked layout), at the bench GPTs' shapes (tokens N = 2048).

A Linear y = x W^T + b makes three GEMMs a step: forward (x W^T), grad input (dy W) and grad
weight (dy^T x). oneDNN's linear takes an [N, in] input and an [out, in] weight, so the backward
ones go through it as linear(dy, W^T) and linear(dy^T, x^T): the transposed copies and the
weight's reorder (weights change every step) are timed with the call ("onednn, all in").
Interleaved rounds, medians; GF/s = 2 N in out / time.

usage: python bench/gemm_cpu.py [--threads 2] [--rounds 15] [--out bench/results/gemm_cpu.md] [--append]
"""
import argparse
import platform
import statistics
import time

import torch

N = 2048
SHAPES = [  # (in, out): small GPT (d 384), medium GPT (d 512), and their tied heads (vocab 4096)
    (384, 1152), (384, 384), (384, 1536), (1536, 384), (384, 4096),
    (512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 4096),
]


def onednn_linear(x, w):
    packed = torch.ops.mkldnn._reorder_linear_weight(w, x.size(0))
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def cases(i, o):
    x, w, dy = torch.randn(N, i), torch.randn(o, i), torch.randn(N, o)
    return {
        "forward": (lambda: torch.mm(x, w.t()), lambda: onednn_linear(x, w)),
        "grad input": (lambda: torch.mm(dy, w), lambda: onednn_linear(dy, w.t().contiguous())),
        "grad weight": (lambda: torch.mm(dy.t(), x), lambda: onednn_linear(dy.t().contiguous(), x.t().contiguous())),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="bench/results/gemm_cpu.md")
    ap.add_argument("--append", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows, total = [], {"mkl": 0.0, "onednn": 0.0}
    for i, o in SHAPES:
        for name, (mkl, dnn) in cases(i, o).items():
            err = ((mkl() - dnn()).abs().max() / mkl().abs().max()).item()
            for f in (mkl, dnn):
                f(), f()  # warm-up
            t = {"mkl": [], "onednn": []}
            for _ in range(args.rounds):
                for key, f in (("mkl", mkl), ("onednn", dnn)):
                    start = time.perf_counter()
                    f()
                    t[key].append(time.perf_counter() - start)
            m, d = statistics.median(t["mkl"]), statistics.median(t["onednn"])
            total["mkl"] += m
            total["onednn"] += d
            flops = 2 * N * i * o
            rows.append(f"| {i} -> {o} | {name} | {m * 1e3:.2f} | {flops / m / 1e9:.0f} | {d * 1e3:.2f} | {flops / d / 1e9:.0f} | {d / m:.3f} | {err:.1e} |")
            print(rows[-1], flush=True)
    with open(args.out, "a" if args.append else "w") as f:
        if not args.append:
            f.write("# fp32 GEMMs on the CPU: MKL vs oneDNN at the bench GPTs' shapes\n\n" + __doc__.split("usage:")[0].strip() + "\n")
        f.write(f"\n## {args.threads} thread(s)\n\nCommand: `~/.local/share/strata/venv/bin/python bench/gemm_cpu.py --threads {args.threads} "
                f"--rounds {args.rounds}{' --append' if args.append else ''}`  \n")
        f.write(f"Machine: {platform.machine()}, AMD EPYC (Zen 4, AVX-512), torch {torch.__version__}; medians of {args.rounds} interleaved rounds.\n\n")
        f.write("| in -> out | GEMM | MKL ms | MKL GF/s | oneDNN, all in ms | oneDNN GF/s | oneDNN / MKL time | max rel. difference |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        f.write("\n".join(rows) + "\n")
        f.write(f"\nAll shapes and GEMMs: MKL {total['mkl'] * 1e3:.1f} ms, oneDNN {total['onednn'] * 1e3:.1f} ms "
                f"({total['onednn'] / total['mkl']:.3f}x).\n")


if __name__ == "__main__":
    main()
