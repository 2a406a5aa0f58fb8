"""CPU attention: Strata's blocked kernel (attention.fused_cpu) vs ATen's fused
scaled_dot_product_attention vs core's attention.reference, forward and forward+backward,
causal, with a packed-document mask (causal within documents) and with a sliding window, fp32.

usage: python bench/attention.py [--build build] [--threads 2] [--out bench/results/attention_cpu.md]
                                 [--masks causal,documents,window:256,...] [--append]

Each case is one strata_bench_attention run (bench/attention.cpp): REPS interleaved rounds (each
times every implementation once), medians; peak MiB is measured (tensors one call allocates beyond
those live before it, counted by a wrapping CPU allocator), next to the estimate from the sizes
(ESTIMATES below).
"""
import argparse
import json
import pathlib
import platform
import subprocess

CASES = [  # mask, B, H, T, D, reps[, only the implementations whose name starts with this]
    ("causal", 8, 8, 128, 64, 20),
    ("causal", 1, 4, 128, 32, 20),
    ("causal", 2, 8, 256, 64, 10),
    ("causal", 4, 8, 512, 64, 7),
    ("causal", 1, 8, 1024, 64, 5),
    ("causal", 1, 4, 2048, 64, 3),
    ("causal", 1, 4, 4096, 64, 3),
    ("documents", 2, 8, 256, 64, 10),
    ("documents", 4, 8, 512, 64, 7),
    ("documents", 1, 8, 1024, 64, 5),
    ("documents", 1, 4, 2048, 64, 3),
    ("documents", 1, 4, 4096, 64, 3),
    ("causal", 1, 4, 16384, 64, 1, "fused"),  # the others need GBs ([T, T] masks and scores)
    ("documents", 1, 4, 16384, 64, 1, "fused"),
    ("window:256", 1, 4, 1024, 64, 5),  # sliding window: ATen SDPA gets the [T, T] boolean mask
    ("window:256", 1, 4, 4096, 64, 3),
    ("window:1024", 1, 4, 4096, 64, 3),
    ("window:256", 1, 4, 16384, 64, 1, "fused"),
]
BLOCK_Q, BLOCK_K = 64, 128  # kernels/cpu/attention.h

ESTIMATES = """Extra memory (bytes beyond inputs, outputs and gradients; fp32, estimated from sizes):
* fused: the lse, B*H*T*4, plus per thread two [64, 128] score tiles and a transposed K of D*T*4;
  the backward adds at most one dq partial per thread when B*H_kv < threads. Nothing grows with T^2.
* ATen SDPA, plain causal: its logsumexp, B*H*T*4, and per-thread tiles.
* ATen SDPA with the document mask (and the reference without lse, which calls it): the boolean mask
  B*T*T and the float mask ATen converts it to, B*T*T*4.
* reference with lse (what ring attention calls): [B, H, T, T] fp32 scores, exponentials and
  probabilities kept for the backward, about 3*B*H*T*T*4, plus the B*T*T mask."""


def extra_mib(impl, mask, b, h, t, d, threads):
    mib = 1 << 20
    fused = (b * h * t * 4 + threads * 2 * BLOCK_Q * BLOCK_K * 4) / mib
    dense_mask = (b if mask == "documents" else 1) * t * t * 5 / mib if mask != "causal" else 0.0
    return {
        "fused": fused,
        "fused (with lse)": fused,
        "aten sdpa": b * h * t * 4 / mib + dense_mask,
        "reference": b * h * t * 4 / mib + dense_mask,
        "reference (with lse)": (3 * b * h * t * t * 4 + b * t * t) / mib,
    }[impl]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/attention_cpu.md")
    ap.add_argument("--masks", help="only the cases with these masks (comma-separated)")
    ap.add_argument("--append", action="store_true", help="add the cases' sections to --out")
    args = ap.parse_args()
    masks = args.masks.split(",") if args.masks else None
    driver = pathlib.Path(args.build) / "bin" / "strata_bench_attention"
    command = (f"`~/.local/share/strata/venv/bin/python bench/attention.py --build {args.build} --threads {args.threads}"
               + (f" --masks {args.masks}" if args.masks else "") + (" --append" if args.append else "") + "`")
    lines = [f"Command: {command}", ""] if args.append else [f"# Attention on CPU ({platform.machine()}, {args.threads} threads, fp32)", "",
             f"Command: {command}",
             "Median ms per call over interleaved rounds (forward under no_grad; forward+backward of sum(out * w)",
             "to q, k, v). Peak MiB: measured, the tensors one call allocates beyond those live before it",
             "(outputs and gradients included); est.: the formula below for the extra memory alone.",
             "`fused` is the blocked kernel called directly; the operator attention.fused_cpu runs it for",
             "every fp32 call (plain bfloat16/half calls go to ATen SDPA, kernels/README.md). Ratios are",
             "the other implementation's time over the fused kernel's (> 1: fused is faster).", "",
             ESTIMATES, ""]
    for mask, b, h, t, d, reps, *only in CASES:
        if masks and mask not in masks:
            continue
        out = subprocess.run([str(driver), str(b), str(h), str(t), str(d), mask, str(reps), str(args.threads)] + only,
                             check=True, capture_output=True, text=True).stdout
        rows = [json.loads(line) for line in out.splitlines()]
        base = {r["impl"]: r for r in rows}["fused"]
        lines += [f"## {mask}, B={b} H={h} T={t} D={d}", "",
                  "| implementation | forward ms | vs fused | fwd+bwd ms | vs fused | peak MiB fwd | peak MiB fwd+bwd | extra MiB (est.) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['impl']} | {r['forward_ms']:.2f} | {r['forward_ms'] / base['forward_ms']:.2f}x "
                         f"| {r['forward_backward_ms']:.2f} | {r['forward_backward_ms'] / base['forward_backward_ms']:.2f}x "
                         f"| {r['forward_peak_bytes'] / 2**20:.1f} | {r['forward_backward_peak_bytes'] / 2**20:.1f} "
                         f"| {extra_mib(r['impl'], mask, b, h, t, d, args.threads):.1f} |")
        lines.append("")
        print("\n".join(lines[-len(rows) - 4:]), flush=True)
    with open(args.out, "a" if args.append else "w") as f:
        f.write(("\n" if args.append else "") + "\n".join(lines))


if __name__ == "__main__":
    main()
