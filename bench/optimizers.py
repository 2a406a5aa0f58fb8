"""AdamW vs AGD vs WSAM(AdamW) on the default job (examples/strategies/default.toml).

usage: python bench/optimizers.py [--strata build/bin/strata] [--steps 1000] [--out bench/results/optimizers_cpu.md]

Each run trains the default model on the bundled corpus, single process, same seed and data
order; only the optimizer changes: AdamW at the default lr 2e-3, AGD at 2e-4 (the spec's
"about 1/10 of AdamW's") with delta 1e-14 (the spec's value for Transformers), and WSAM with
the paper's gamma 0.9 and rho 0.05 around the same AdamW. Reports the training loss (mean of
50-step windows) and validation loss of the long runs, and the median step time of separate
short runs (--timing-steps, one after another at the end) so that the timings all come from
the same few quiet minutes.
"""
import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import tempfile

RUNS = [  # label, extra --set arguments, extra strategy text
    ("AdamW lr 2e-3", [], ""),
    ("AGD lr 2e-4, delta 1e-14", ["--set", "optimizer.name=agd", "--set", "optimizer.lr=2e-4", "--set", "optimizer.delta=1e-14"], ""),
    ("WSAM(AdamW) rho 0.05, gamma 0.9", [], '\n[[pass]]\nname = "wsam"\nrho = 0.05\ngamma = 0.9\n'),
]


def run(strata, strategy, label, extra, work, steps, evaluate=True):
    out = work / (label.split()[0].replace("(", "_").replace(")", "") + str(steps))
    cmd = [strata, "run", str(strategy), "--out", str(out), "--set", f"job.steps={steps}",
           "--set", "job.checkpoint_every=0", "--set", f"job.eval_every={steps // 5 if evaluate else 0}"] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--timing-steps", type=int, default=80)
    ap.add_argument("--out", default="bench/results/optimizers_cpu.md")
    args = ap.parse_args()
    base = pathlib.Path("examples/strategies/default.toml").read_text()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for label, extra, passes in RUNS:
            strategy = work / f"strategy{len(results)}.toml"
            strategy.write_text(base + passes)
            records = run(args.strata, strategy, label, extra, work, args.steps)
            results.append((label, records))
            print(label, "done", flush=True)
        timings = []
        for i, (label, extra, passes) in enumerate(RUNS):
            records = run(args.strata, work / f"strategy{i}.toml", label, extra, work, args.timing_steps, evaluate=False)
            timings.append(statistics.median(r["step_ms"] for r in records[10:]))

    window = 50
    marks = [s for s in range(window, args.steps + 1, max(window, args.steps // 10))]
    def train_loss_at(records, step):
        values = [r["loss"] for r in records if step - window < r["step"] <= step]
        return sum(values) / len(values)

    lines = [f"# AdamW vs AGD vs WSAM(AdamW) on the default job ({platform.machine()}, CPU, 1 process)", "",
             f"Command: `~/.local/share/strata/venv/bin/python bench/optimizers.py --steps {args.steps}`.",
             "Default job: GPT 4 layers, d_model 128, byte-level, KJV text, global batch 16, seq 128, warmup 50,",
             "cosine to 0.1 lr, weight decay 0.1, grad clip 1.0; same seed and batches for every run.",
             f"Step times: median of steps 11..{args.timing_steps} of separate {args.timing_steps}-step runs made one after another.", "",
             "| optimizer | final train loss (mean of last 50 steps) | val loss at end | best val loss | median ms/step | ms/step vs AdamW |",
             "|---|---|---|---|---|---|"]
    adamw_ms = None
    for (label, records), ms in zip(results, timings):
        val = [r["val_loss"] for r in records if "val_loss" in r]
        adamw_ms = adamw_ms or ms
        lines.append(f"| {label} | {train_loss_at(records, args.steps):.4f} | {val[-1]:.4f} | {min(val):.4f} | {ms:.1f} | {ms / adamw_ms:.2f} |")
    lines += ["", f"Training loss, mean of the {window} steps ending at each step:", "",
              "| step | " + " | ".join(label for label, _ in results) + " |", "|---" * (len(results) + 1) + "|"]
    for step in marks:
        lines.append(f"| {step} | " + " | ".join(f"{train_loss_at(r, step):.4f}" for _, r in results) + " |")
    lines += ["", "Validation loss:", "", "| step | " + " | ".join(label for label, _ in results) + " |",
              "|---" * (len(results) + 1) + "|"]
    for step in sorted({r["step"] for _, recs in results for r in recs if "val_loss" in r}):
        row = [next((r["val_loss"] for r in recs if r["step"] == step and "val_loss" in r), float("nan")) for _, recs in results]
        lines.append(f"| {step} | " + " | ".join(f"{v:.4f}" for v in row) + " |")
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
