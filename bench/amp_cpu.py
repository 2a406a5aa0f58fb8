"""amp on a CPU without native half-precision GEMMs: ATen's bf16/fp16 GEMMs against Strata's
(the same GEMMs in fp32 on the widened operands, each result rounded once: kernels/cpu/linear_onednn.cpp,
and attention's tiles in the blocked kernel), next to fp32.

usage: python bench/amp_cpu.py [--strata build/bin/strata] [--steps 12] [--rounds 2]
                               [--out bench/results/amp_cpu.md]

* The training step: `strata run tests/cli/amp.toml` (GPT, 4 blocks of d_model 128, batch 16 x
  128, AdamW, one rank, amp's default threads) in fp32 (amp disabled), and in bf16 and fp16 with
  ATen's GEMMs (STRATA_CPU_FALLBACK=bf16_gemm_via_fp32,fp16_gemm_via_fp32: what PyTorch eager's
  autocast runs) and with Strata's. Interleaved rounds; per run the median step_ms of steps 2..;
  the last step's loss of each, to show the two half-precision paths train alike.
* One Linear, forward and backward, at 512 x 768 -> 3072 in PyTorch eager on one thread:
  torch.nn.functional.linear in bf16/fp16 (ATen's GEMM) against the same in fp32 on the widened
  operands, rounded back (the arithmetic Strata's kernel does), median of 5.
Where ATen's oneDNN has native half GEMMs (AVX-512 BW/VL/DQ, AVX-NE-CONVERT, AMX) Strata leaves
them to ATen and both half columns are ATen's.
"""
import argparse, json, os, statistics, subprocess, time

from machine import cpu_model

FORCE_ATEN = "bf16_gemm_via_fp32,fp16_gemm_via_fp32"
RUNS = [("fp32", ["--disable", "amp"], None), ("bf16, ATen's GEMMs", ["--set", 'pass.amp.dtype="bf16"'], FORCE_ATEN),
        ("bf16, Strata's", ["--set", 'pass.amp.dtype="bf16"'], ""), ("fp16, ATen's GEMMs", ["--set", 'pass.amp.dtype="fp16"'], FORCE_ATEN),
        ("fp16, Strata's", ["--set", 'pass.amp.dtype="fp16"'], "")]


def step(strata, steps, settings, fallback, out):
    env = dict(os.environ)
    env.pop("STRATA_CPU_FALLBACK", None)
    if fallback:
        env["STRATA_CPU_FALLBACK"] = fallback
    subprocess.run([strata, "run", "tests/cli/amp.toml", "--disable", "ddp", "--out", out, "--overwrite", "--set", f"job.steps={steps}",
                    "--set", "job.eval_every=0", "--set", "job.checkpoint_every=0", "--set", "job.checkpoint_at_end=false", *settings],
                   check=True, capture_output=True, env=env)
    metrics = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    return statistics.median(m["step_ms"] for m in metrics if m["step"] >= 2), metrics[-1]["loss"]


def linear_ms():
    import torch
    torch.set_num_threads(1)
    x32, w32, dy32 = torch.randn(512, 768), torch.randn(3072, 768), torch.randn(512, 3072)

    def timed(f):
        f()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            f()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        x, w, dy = x32.to(dtype), w32.to(dtype), dy32.to(dtype)
        aten = timed(lambda: (torch.nn.functional.linear(x, w), dy.mm(w), dy.t().mm(x)))
        wide = timed(lambda: (torch.nn.functional.linear(x.float(), w.float()).to(dtype), dy.float().mm(w.float()).to(dtype),
                              dy.float().t().mm(x.float()).to(dtype)))
        rows.append((str(dtype).replace("torch.", ""), aten, wide))
    fp32 = timed(lambda: (torch.nn.functional.linear(x32, w32), dy32.mm(w32), dy32.t().mm(x32)))
    return rows, fp32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="bench/results/amp_cpu.md")
    args = parser.parse_args()
    work = "/tmp/strata_bench_amp_cpu"
    results = {name: [] for name, _, _ in RUNS}
    for _ in range(args.rounds):
        for name, settings, fallback in RUNS:
            results[name].append(step(args.strata, args.steps, settings, fallback, work))
    subprocess.run(["rm", "-rf", work], check=False)
    ops = subprocess.run([args.strata, "ops"], capture_output=True, text=True).stdout
    paths = [l.strip() for l in ops.splitlines() if "_gemm_via_fp32]" in l]
    fp32 = statistics.median(ms for ms, _ in results["fp32"])
    lines = [f"# amp on the CPU: ATen's half-precision GEMMs against Strata's", "",
             f"Command: `python bench/amp_cpu.py --steps {args.steps} --rounds {args.rounds}`", "", f"Machine: {cpu_model()}, {os.cpu_count()} cores.",
             "", "Strata's decisions here (`strata ops`):", "", *[f"* {p}" for p in paths], "",
             "Training step (`tests/cli/amp.toml`, one rank), median step_ms of steps 2.. per run, median over the rounds:", "",
             "| run | step ms | / fp32 | rounds | last loss |", "|---|---|---|---|---|"]
    for name, _, _ in RUNS:
        ms = statistics.median(m for m, _ in results[name])
        lines.append(f"| {name} | {ms:.0f} | {ms / fp32:.2f}x | {', '.join(f'{m:.0f}' for m, _ in results[name])} | {results[name][-1][1]:.6f} |")
    rows, linear32 = linear_ms()
    lines += ["", "One Linear, forward and both backward GEMMs, 512 x 768 -> 3072, PyTorch eager, one thread, median of 5:", "",
              "| dtype | ATen's GEMMs ms | fp32 GEMMs on the widened operands ms | ATen / widened |", "|---|---|---|---|"]
    lines += [f"| {d} | {a:.1f} | {w:.1f} | {a / w:.1f}x |" for d, a, w in rows]
    lines += [f"| fp32 (for scale) | {linear32:.1f} | | |", ""]
    open(args.out, "w").write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
