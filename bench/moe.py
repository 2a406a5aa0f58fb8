"""Mixture of experts on CPU: the Mixtral model against the dense Llama of equal active
parameters, the bytes expert parallel exchanges against the formula, and Strata's grouped
expert computation against a loop over experts.

usage: python bench/moe.py [--strata build/bin/strata] [--out bench/results/moe_cpu.md] [--steps 8] [--rounds 3]

1. tokens/s, one process, 1 thread: mixtral (8 experts of width f, top 2) vs llama with SwiGLU
   width 2f (the same active parameters per token: two experts' worth), same attention, data,
   batch; interleaved rounds, medians of steps 3..steps of each run, then the median over rounds.
2. moe_all_to_all_bytes (rank 0's bytes to other ranks in one step, forward and backward) under
   expert parallel at P = 2 and 4 against 4 T k d 4 (P - 1) / P per MoE layer and micro-batch
   (uniform routing; measured routing is not uniform, so they differ by the imbalance).
3. The expert computation of one MoE layer, forward and backward, in PyTorch (the same ATen calls
   on this machine): tokens sorted by expert and one GEMM per expert on contiguous rows (what
   Strata's grouped_mm does) vs transformers' Mixtral loop (per expert: find its tokens, gather,
   compute, scatter-add).
4. With a capacity, model.expert_rows "packed" (the kept rows, their counts read each forward) vs
   "padded" (every expert C rows: static shapes, no read), at capacity factors 1.0 and 1.25: one
   process's tokens/s (interleaved rounds) and host reads per step; under expert parallel at P = 2
   the all-to-all bytes, against the padded formula 4 x E C d 4 (P - 1) / P per layer and
   micro-batch (C = ceil(c k T / E); every slot travels, filled or not).

--parts picks some of them (e.g. --parts 4 --out bench/results/moe_capacity_cpu.md).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

MODEL = ["--set", "model.n_layer=4", "--set", "model.d_model=256", "--set", "model.n_head=4", "--set", "model.n_kv_head=4",
         "--set", "model.vocab_size=256", "--set", "model.seq_len=128"]


def run(strata, strategy, steps, extra, n=1):
    out = tempfile.mkdtemp(prefix="moe_bench_")
    cmd = [strata, "run", "-n", str(n), strategy, "--set", f"job.steps={steps}", "--set", "job.eval_every=0",
           "--set", "job.checkpoint_every=0", "--set", "job.threads=1", "--set", "job.log_every=100",
           *MODEL, *extra, "--out", out, "--overwrite"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return rows[2:], cmd


def part1(strata, steps, rounds):
    f = 256
    cases = {
        "mixtral 8 x f=256, top 2": ("examples/strategies/mixtral.toml",
                                     ["--set", f"model.ffn_hidden={f}", "--set", "parallel.expert=1", "--disable", "expert_parallel",
                                      "--disable", "ddp", "--set", "job.global_batch=8", "--set", "job.micro_batch=8"]),
        "llama, SwiGLU 2f=512": ("examples/strategies/llama_text.toml",
                                 ["--set", f"model.ffn_hidden={2 * f}", "--set", "job.global_batch=8", "--set", "job.micro_batch=8",
                                  "--set", "model.tie_embeddings=false"]),
    }
    per = {k: [] for k in cases}
    cmds = {}
    for _ in range(rounds):
        for name, (strategy, extra) in cases.items():
            rows, cmds[name] = run(strata, strategy, steps, extra)
            per[name].append(statistics.median(r["tokens"] / r["step_ms"] * 1000 for r in rows))
    lines = ["## 1. Tokens/s: mixtral vs the dense Llama of equal active parameters (1 process, 1 thread)", "",
             "| model | tokens/s (median of rounds) | rounds | vs dense |", "|---|---|---|---|"]
    dense = statistics.median(per["llama, SwiGLU 2f=512"])
    for name in cases:
        m = statistics.median(per[name])
        lines.append(f"| {name} | {m:.0f} | {', '.join(f'{x:.0f}' for x in per[name])} | {m / dense:.3f} |")
    lines += ["", "Commands (one round): " + "; ".join("`" + " ".join(c) + "`" for c in cmds.values()), ""]
    return lines


def part2(strata, steps):
    lines = ["## 2. All-to-all bytes per step (rank 0) vs the formula", "",
             "4 MoE layers, micro-batch 2 sequences x 128 tokens, top 2, d 256, fp32, 2 micro-batches per step per rank.", "",
             "| expert P | ranks | measured bytes/step (median) | formula 4 T k d 4 (P-1)/P x layers x micro-batches | ratio |",
             "|---|---|---|---|---|"]
    for p in (2, 4):
        rows, cmd = run(strata, "examples/strategies/mixtral.toml", steps,
                        ["--set", f"parallel.expert={p}", "--set", f"job.global_batch={4 * p}", "--set", "job.micro_batch=2"], n=p)
        measured = statistics.median(r["moe_all_to_all_bytes"] for r in rows)
        t, k, d, layers, micro = 2 * 128, 2, 256, 4, 2
        formula = 4 * t * k * d * 4 * (p - 1) / p * layers * micro
        lines.append(f"| {p} | {p} | {measured:.0f} | {formula:.0f} | {measured / formula:.3f} |")
    lines += ["", "Command (P = 4): `" + " ".join(cmd) + "`", ""]
    return lines


def part3(rounds):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n, d, f, e, k = 2048, 256, 256, 8, 2
    x = torch.randn(n, d, requires_grad=True)
    w1, w3 = (torch.randn(e, f, d) * 0.02).requires_grad_(), (torch.randn(e, f, d) * 0.02).requires_grad_()
    w2 = (torch.randn(e, d, f) * 0.02).requires_grad_()
    probs = torch.randn(n, e).softmax(-1)
    top_w, top_i = probs.topk(k, -1)
    top_w = top_w / top_w.sum(-1, keepdim=True)

    def sorted_grouped():
        expert = top_i.t().reshape(-1)
        token = torch.arange(n).repeat(k)
        weight = top_w.t().reshape(-1)
        order = torch.sort(expert, stable=True).indices
        sizes = torch.bincount(expert, minlength=e).tolist()
        rows = x.index_select(0, token[order]).split(sizes)
        outs = [(torch.nn.functional.silu(r @ w1[i].t()) * (r @ w3[i].t())) @ w2[i].t() for i, r in enumerate(rows)]
        y = torch.cat(outs) * weight[order].unsqueeze(1)
        return torch.zeros_like(x).index_add(0, token[order], y)

    def loop_over_experts():
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(top_i, e).permute(2, 1, 0)  # transformers' expert_mask
        for i in range(e):
            idx, tok = torch.where(mask[i])
            if tok.numel() == 0:
                continue
            r = x[tok]
            y = ((torch.nn.functional.silu(r @ w1[i].t()) * (r @ w3[i].t())) @ w2[i].t()) * top_w[tok, idx, None]
            out.index_add_(0, tok, y)
        return out

    ref = loop_over_experts().detach()
    assert torch.allclose(sorted_grouped().detach(), ref, atol=1e-5), "the two formulations differ"
    times = {"sorted, one GEMM per expert (Strata's)": [], "loop over experts (transformers')": []}
    fns = {"sorted, one GEMM per expert (Strata's)": sorted_grouped, "loop over experts (transformers')": loop_over_experts}
    for _ in range(rounds * 5):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn().sum().backward()
            times[name].append((time.perf_counter() - start) * 1000)
            for t in (x, w1, w2, w3):
                t.grad = None
    lines = ["## 3. One MoE layer's experts, forward + backward, PyTorch ATen, 1 thread", "",
             f"{n} tokens, d {d}, expert width {f}, {e} experts, top {k}; {rounds * 5} interleaved repetitions, medians.", "",
             "| formulation | ms | vs loop |", "|---|---|---|"]
    loop = statistics.median(times["loop over experts (transformers')"])
    for name, t in times.items():
        lines.append(f"| {name} | {statistics.median(t):.2f} | {statistics.median(t) / loop:.3f} |")
    return lines + [""]


def part4(strata, steps, rounds):
    lines = ["## 4. Capacity: packed vs padded expert rows", "",
             "Mixtral as in part 1 (8 experts, top 2, micro-batch 8 x 128 tokens), capacity_factor c; one process, 1 thread.", "",
             "| c | expert_rows | tokens/s (median of rounds) | rounds | vs packed | host reads in non-logging steps | dropped fraction |",
             "|---|---|---|---|---|---|---|"]
    base = ["--set", "model.ffn_hidden=256", "--set", "parallel.expert=1", "--disable", "expert_parallel", "--disable", "ddp",
            "--set", "job.global_batch=8", "--set", "job.micro_batch=8", "--set", "job.log_every=1000"]
    cmds = []
    for c in (1.0, 1.25):
        per, reads, dropped = {"packed": [], "padded": []}, {}, {}
        for _ in range(rounds):
            for rows_kind in per:
                rows, cmd = run(strata, "examples/strategies/mixtral.toml", steps,
                                base + ["--set", f"model.capacity_factor={c}", "--set", f'model.expert_rows="{rows_kind}"'])
                per[rows_kind].append(statistics.median(r["tokens"] / r["step_ms"] * 1000 for r in rows))
                reads[rows_kind] = statistics.median(r["host_reads"] for r in rows[:-1])  # the last step reads its figures
                dropped[rows_kind] = rows[-1]["moe_dropped_fraction"]
                cmds.append(cmd)
        packed = statistics.median(per["packed"])
        for rows_kind, t in per.items():
            m = statistics.median(t)
            lines.append(f"| {c} | {rows_kind} | {m:.0f} | {', '.join(f'{x:.0f}' for x in t)} | {m / packed:.3f} | "
                         f"{reads[rows_kind]:.0f} | {dropped[rows_kind]:.3f} |")
    lines += ["", "Command (one run): `" + " ".join(cmds[-1]) + "`", "",
              "Expert parallel, P = 2 (2 ranks, micro-batch 2 x 128 tokens, 4 layers, d 256, fp32, 2 micro-batches a step), c = 1.0:", "",
              "| expert_rows | all-to-all bytes/step (rank 0, median) | padded formula | ratio |", "|---|---|---|---|"]
    p, t, k, d, layers, micro, e = 2, 2 * 128, 2, 256, 4, 2, 8
    cap = -(-int(1.0 * k * t) // e)  # ceil(c k T / E)
    formula = 4 * e * cap * d * 4 * (p - 1) / p * layers * micro
    for rows_kind in ("packed", "padded"):
        rows, cmd = run(strata, "examples/strategies/mixtral.toml", steps,
                        ["--set", f"parallel.expert={p}", "--set", f"job.global_batch={4 * p}", "--set", "job.micro_batch=2",
                         "--set", "model.capacity_factor=1.0", "--set", f'model.expert_rows="{rows_kind}"'], n=p)
        measured = statistics.median(r["moe_all_to_all_bytes"] for r in rows)
        lines.append(f"| {rows_kind} | {measured:.0f} | {formula:.0f} | {measured / formula:.3f} |")
    lines += ["", "Command (padded): `" + " ".join(cmd) + "`", ""]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/moe_cpu.md")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", default="1,2,3,4")
    a = ap.parse_args()
    parts = {int(x) for x in a.parts.split(",")}
    lines = ["# Mixture of experts on CPU", "",
             f"Command: `python bench/moe.py --steps {a.steps} --rounds {a.rounds} --parts {a.parts}`", "",
             f"Machine: {os.cpu_count()} cores (shared, noisy); one thread per rank.", ""]
    if 1 in parts:
        lines += part1(a.strata, a.steps, a.rounds)
    if 2 in parts:
        lines += part2(a.strata, a.steps)
    if 3 in parts:
        lines += part3(a.rounds)
    if 4 in parts:
        lines += part4(a.strata, a.steps, a.rounds)
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
