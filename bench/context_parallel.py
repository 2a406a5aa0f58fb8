"""Context parallel on CPU: bytes each rank sends per step for Ulysses and ring next to their
formulas, causal attention work per rank with and without zigzag, step time against one
process, and the peak memory per rank of a long sequence at context 4.

usage: python bench/context_parallel.py [--strata build/bin/strata] [--out bench/results/context_parallel_cpu.md]
                                        [--steps 4]

Model: byte-level GPT on data/kjv.txt (one document per window), d_model 256, 8 heads, 2 blocks, micro-batch 1, one
thread per rank, no evaluation or checkpoints. Figures are Strata's per-step metrics
(metrics.jsonl, written by rank 0): cp_all_to_all_bytes and cp_ring_bytes (what rank 0 sent:
every all-to-all's whole input, every key/value block and gradient block of the ring),
step_ms, mem_peak_bytes (the largest peak RSS of any rank), mem_device_peak_bytes (rank 0's
peak of live tensor bytes, the counting allocator's); medians over steps 2..steps. The ring
runs both ways ([[pass]] context_parallel ring_backward autograd and rotate). On a
machine with fewer cores than ranks the ranks share cores: step times compare layouts on this
machine, not the method's speed on one core per rank.
"""
import argparse, json, os, statistics, subprocess, tempfile

STRATEGY = "tests/cli/context_parallel.toml"
MODEL = ["--set", "model.d_model=256", "--set", "model.n_head=8", "--set", "model.n_layer=2", "--set", "data.document_end=-1"]


def run(strata, steps, n, seq, extra=()):
    out = tempfile.mkdtemp(prefix="cp_bench_")
    cmd = [strata, "run", STRATEGY, *MODEL, "--set", f"model.seq_len={seq}", "--set", "job.global_batch=2", "--set", "job.micro_batch=1",
           "--set", f"job.steps={steps}", "--set", "job.eval_every=0", "--set", "job.log_every=1000", "--out", out, "--overwrite"]
    if n > 1:
        cmd += ["-n", str(n), "--set", f"parallel.context={n}"]
    else:
        cmd += ["--set", "parallel.context=1", "--disable", "context_parallel"]
    cmd += list(extra)
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))][1:]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in rows)
    return {k: med(k) for k in ("cp_all_to_all_bytes", "cp_ring_bytes", "step_ms", "mem_peak_bytes", "mem_device_peak_bytes")}


def visible_pairs(seq, c, rank, zigzag):
    """Causal (query, key) pairs rank `rank` computes: each query sees itself and every earlier token."""
    if zigzag:
        length = seq // (2 * c)
        chunks = [rank, 2 * c - 1 - rank]
    else:
        length = seq // c
        chunks = [rank]
    return sum(sum(chunk * length + i + 1 for i in range(length)) for chunk in chunks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/context_parallel_cpu.md")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    lines = ["# Context parallel on CPU", "", f"Command: `python bench/context_parallel.py --steps {a.steps}`", "",
             f"Machine: {os.cpu_count()} cores; one thread per rank. Model: GPT d_model 256 (h = 256), 8 heads, 2 blocks, "
             "micro-batch B = 1, 2 micro-batches per step (m = 2), fp32 (4 bytes).", ""]

    # 1. Bytes per step per rank against the formulas.
    seq, layers, h, m = 1024, 2, 256, 2
    lines += ["## 1. Bytes rank 0 sends per step (seq_len 1024)", "",
              "Ulysses: 4 all-to-alls per layer forward (q, k, v, output), 4 backward, each of the rank's B x T/c x h "
              "activation: m x L x 8 x B x (T/c) x h x 4 bytes. Ring: c - 1 key/value blocks per layer forward and as many "
              "gradient blocks backward, each 2 x B x (T/c) x h: m x L x 2 (c-1) x 2 x B x (T/c) x h x 4 bytes; with "
              "ring_backward = rotate (the default here) the blocks travel again in backward: 3 (c-1) instead of 2 (c-1). "
              "(A rank keeps (1/c) of each all-to-all; the counter counts the whole input, as the formula does.)", "",
              "| method | c | measured all-to-all | measured ring | formula | measured / formula |", "|---|---|---|---|---|---|"]
    for method in ["ulysses", "ring autograd", "ring rotate"]:
        for c in [2, 4]:
            extra = ("--set", "pass.context_parallel.method=ring", "--set", f"pass.context_parallel.ring_backward={method.split()[1]}") \
                if method.startswith("ring") else ("--set", f"pass.context_parallel.method={method}")
            r = run(a.strata, a.steps, c, seq, extra)
            if method == "ulysses":
                formula, measured = m * layers * 8 * (seq // c) * h * 4, r["cp_all_to_all_bytes"]
            else:
                blocks = 3 if method == "ring rotate" else 2
                formula, measured = m * layers * blocks * (c - 1) * 2 * (seq // c) * h * 4, r["cp_ring_bytes"]
            lines.append(f"| {method} | {c} | {r['cp_all_to_all_bytes'] / 2**20:.2f} MiB | {r['cp_ring_bytes'] / 2**20:.2f} MiB | "
                         f"{formula / 2**20:.2f} MiB | {measured / formula:.3f} |")
            print(lines[-1], flush=True)

    # 2. Causal work balance.
    seq_b, c_b = 4096, 4
    lines += ["", f"## 2. Causal attention work per rank (visible query-key pairs, seq_len {seq_b}, c = {c_b})", "",
              "| split | pairs per rank 0..3 | slowest / mean |", "|---|---|---|"]
    for zigzag in [False, True]:
        pairs = [visible_pairs(seq_b, c_b, r, zigzag) for r in range(c_b)]
        lines.append(f"| {'zigzag' if zigzag else 'contiguous'} | {' / '.join(f'{p / 1e6:.2f}M' for p in pairs)} | "
                     f"{max(pairs) / statistics.mean(pairs):.2f} |")
        print(lines[-1], flush=True)
    lines += ["", "Measured step time of the same two splits (ring, c = 4, seq_len 4096):", "",
              "| split | step ms |", "|---|---|"]
    for balance in ["contiguous", "zigzag"]:
        r = run(a.strata, a.steps, 4, seq_b, ("--set", "pass.context_parallel.method=ring", "--set",
                                               f"pass.context_parallel.load_balance={balance}"))
        lines.append(f"| {balance} | {r['step_ms']:.0f} |")
        print(lines[-1], flush=True)

    # 3. Step time against one process.
    lines += ["", "## 3. Step time against one process (seq_len 2048)", "", "| layout | step ms | ratio to one process |", "|---|---|---|"]
    one = run(a.strata, a.steps, 1, 2048)
    lines.append(f"| one process | {one['step_ms']:.0f} | 1.00 |")
    autograd = ("--set", "pass.context_parallel.ring_backward=autograd")
    rotate = ("--set", "pass.context_parallel.ring_backward=rotate")
    for label, method, c, extra in [("ulysses", "ulysses", 2, ()), ("ring autograd", "ring", 2, autograd), ("ring rotate", "ring", 2, rotate),
                                    ("ulysses", "ulysses", 4, ()), ("ring autograd", "ring", 4, autograd), ("ring rotate", "ring", 4, rotate),
                                    ("2d", "2d", 4, ())]:
        r = run(a.strata, a.steps, c, 2048, ("--set", f"pass.context_parallel.method={method}", *extra))
        lines.append(f"| {label}, c = {c} | {r['step_ms']:.0f} | {r['step_ms'] / one['step_ms']:.2f} |")
        print(lines[-1], flush=True)

    # 4. A long sequence: peak memory per rank.
    seq_l = 16384
    lines += ["", f"## 4. Peak memory per rank at seq_len {seq_l}", "",
              "Peak RSS: the largest of any rank; live tensors: rank 0's peak of live tensor bytes. "
              "The ring with ring_backward = autograd keeps every key/value block seen and every partial result: the estimate counts "
              "(2 (c-1) h + 4 h) values per own token and layer for them.", "",
              "| layout | peak RSS MiB | peak live tensors MiB |", "|---|---|---|"]
    ring = ("--set", "pass.context_parallel.method=ring")
    for label, c, extra in [("one process", 1, ()), ("ulysses, c = 4", 4, ("--set", "pass.context_parallel.method=ulysses")),
                            ("ring autograd, c = 4", 4, (*ring, *autograd)), ("ring rotate, c = 4", 4, (*ring, *rotate))]:
        r = run(a.strata, 2, c, seq_l, extra)
        lines.append(f"| {label} | {r['mem_peak_bytes'] / 2**20:.0f} | {r['mem_device_peak_bytes'] / 2**20:.1f} |")
        print(lines[-1], flush=True)
    open(a.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
