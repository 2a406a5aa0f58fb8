"""Where a step's time goes, by kind of work, for the step-time bench's models: Strata's own
profile ([job] profile_steps, its defaults: fused kernels) next to torch.profiler's of PyTorch eager
on the same model, batch and loop (bench/fused_step_time.py builds both), one process each
(issue 33's "profile first, repeat at the end").

usage: python bench/profile_cpu.py [--strata build/bin/strata] [--sizes default,small,medium,llama]
                                   [--threads 2] [--steps 3] [--top 12]
                                   [--out bench/results/profile_cpu.md] [--append]

Each operator's *self* time (children excluded, so nothing counts twice) goes to one kind by its
name (KINDS below, first match wins): GEMMs (the Linear layers' matrix products), attention,
norms, activations, loss, optimizer (clipping's norms and the update), and other (elementwise
ops, copies, fills, reductions such as the bias gradients, autograd's bookkeeping). Strata's
operator calls are profiler ranges named by implementation (attention.fused_cpu, ...), so its
kernels' own loops count where they belong. "not in operators": wall time no operator covers
(Python or Strata code between ops, waiting). Profiled steps run after 3 warm-up steps.
"""
import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fused_step_time as fst  # noqa: E402  (the models, sizes and Strata command of the step-time bench)

WARMUP = 3
KINDS = [  # (kind, substrings of the lower-cased operator name)
    ("attention", ["attention", "flash"]),
    ("GEMM", ["linear_pointwise", "linear_weight_gradient", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
              "aten::linear", "aten::matmul", "linear.", "mmbackward", "addmmbackward"]),
    ("norm", ["layer_norm", "layernorm", "rms_norm", "rmsnorm"]),
    ("activation", ["gelu", "swiglu", "silu"]),
    ("loss", ["cross_entropy", "crossentropy", "log_softmax", "logsoftmax", "nll_loss", "nllloss"]),
    ("optimizer", ["adam", "agd", "_foreach", "vector_norm", "clip_grad", "optimizer"]),
]
ORDER = [k for k, _ in KINDS] + ["other", "not in operators"]


def kind_of(name):
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def strata_profile(binary, model, size, threads, steps):
    """(wall ms per step, [(operator, calls per step, self ms per step, kind)]) from profile_rank0.md."""
    with tempfile.TemporaryDirectory() as out:
        cmd, run_dir = fst.strata_command(binary, model, size, WARMUP + steps, threads, "strata", out)
        cmd += ["--set", f"job.profile_steps={steps}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        text = (run_dir / "profile_rank0.md").read_text()
    wall = float(text.split(" profiled steps, ")[1].split(" ms per step")[0])
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("operator",) and not cells[0].startswith("---"):
            rows.append((cells[0], float(cells[1]), float(cells[2]), kind_of(cells[0])))
    return wall, rows


def eager_worker(spec):
    """In a child process: torch.profiler over `steps` eager steps after the warm-up."""
    import torch
    steps = spec["profile_steps"]
    step = fst.pytorch_setup(dict(spec, steps=WARMUP + steps, compile=False))
    for s in range(WARMUP):
        step(s)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for s in range(WARMUP, WARMUP + steps):
            step(s)
        wall = (time.perf_counter() - start) * 1000 / steps
    # PyTorch's AdamW on the CPU runs plain elementwise ops (add_, mul_, ...): they count as
    # optimizer work when an ancestor is the optimizer's step range.
    totals = {}
    for e in prof.events():
        kind, parent = kind_of(e.name), e.cpu_parent
        while parent is not None and kind != "optimizer":
            if parent.name.startswith("Optimizer.step"):
                kind = "optimizer"
            parent = parent.cpu_parent
        calls, ms = totals.get((e.name, kind), (0, 0.0))
        totals[(e.name, kind)] = (calls + 1, ms + e.self_cpu_time_total / 1000)
    rows = [(name, calls / steps, ms / steps, kind) for (name, kind), (calls, ms) in totals.items()]
    print(json.dumps({"wall": wall, "rows": rows}))


def eager_profile(model, size, threads, steps):
    spec = json.dumps({"model": model, "size": size, "threads": threads, "profile_steps": steps})
    out = subprocess.run([sys.executable, __file__, "--worker", spec], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["wall"], [tuple(x) for x in r["rows"]]


def by_kind(wall, rows):
    ms = {k: 0.0 for k in ORDER}
    for _, _, self_ms, kind in rows:
        ms[kind] += self_ms
    ms["not in operators"] = max(0.0, wall - sum(ms.values()))
    return ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--sizes", default="default,small,medium,llama")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", default="bench/results/profile_cpu.md")
    parser.add_argument("--append", action="store_true")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        return eager_worker(json.loads(args.worker))

    sections = []
    for name in args.sizes.split(","):
        size, model = fst.SIZES[name], fst.model_of(name)
        s_wall, s_rows = strata_profile(args.strata, model, size, args.threads, args.steps)
        e_wall, e_rows = eager_profile(model, size, args.threads, args.steps)
        sk, ek = by_kind(s_wall, s_rows), by_kind(e_wall, e_rows)
        print(name, f"strata {s_wall:.1f} ms", {k: round(v, 1) for k, v in sk.items()},
              f"eager {e_wall:.1f} ms", {k: round(v, 1) for k, v in ek.items()}, flush=True)
        l, h, d, t, b, v = size
        text = [f"### {name}: {model}, {l} layers x d_model {d}, seq {t} x batch {b}, vocab {v}\n",
                f"Step (wall, profiled): Strata {s_wall:.1f} ms, eager {e_wall:.1f} ms ({s_wall / e_wall:.3f}x).\n",
                "| kind | Strata ms | Strata share | eager ms | eager share | Strata - eager ms |", "|---|---|---|---|---|---|"]
        for k in ORDER:
            text.append(f"| {k} | {sk[k]:.1f} | {100 * sk[k] / s_wall:.1f}% | {ek[k]:.1f} | {100 * ek[k] / e_wall:.1f}% | "
                        f"{sk[k] - ek[k]:+.1f} |")
        text.append(f"\nTop {args.top} operators by self time (ms per step; kind in brackets):\n")
        text.append("| Strata | ms | eager | ms |\n|---|---|---|---|")
        top = lambda rows: sorted(rows, key=lambda r: -r[2])[: args.top]
        for (sn, _, sm, sk_), (en, _, em, ek_) in zip(top(s_rows), top(e_rows)):
            text.append(f"| {sn.replace('|', '/')} [{sk_}] | {sm:.1f} | {en.replace('|', '/')} [{ek_}] | {em:.1f} |")
        sections.append("\n".join(text) + "\n")

    with open(args.out, "a" if args.append else "w") as f:
        if not args.append:
            f.write("# Where the step time goes: Strata (fused kernels) vs PyTorch eager, by kind of work (CPU, fp32)\n\n"
                    "Self time of each operator (children excluded), summed by kind; see bench/profile_cpu.py for the "
                    "kinds. The models, batch and loop of bench/fused_step_time.py (AdamW, clipping 1.0). Profiling "
                    "adds a little to every operator call, so these walls sit a few % above the bench's.\n")
        f.write(f"\n## {args.threads} thread(s)\n\nCommand: `~/.local/share/strata/venv/bin/python bench/profile_cpu.py "
                f"--sizes {args.sizes} --threads {args.threads} --steps {args.steps} --top {args.top}"
                f"{' --append' if args.append else ''}`  \n")
        f.write(f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared, noisy); {args.steps} profiled steps after "
                f"{WARMUP} warm-up steps, one process each.\n\n")
        f.write("\n".join(sections))
    print(open(args.out).read())


if __name__ == "__main__":
    main()
