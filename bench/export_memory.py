#!/usr/bin/env python3
"""Peak memory of `strata ckpt export` against the model's size (docs/training.md, "Hugging Face
interchange"): a Llama, a GPT (Conv1D weights transposed on export) and a Mixtral (stacked experts
written one expert a tensor), each trained one step on one process and saved, then exported in
fp32 and bf16, one file and split at 100MB. Peak resident memory from the exporting process's
rusage (ru_maxrss), each export run `--rounds` times interleaved, the median kept.

usage: bench/export_memory.py [--strata build/bin/strata] [--rounds 3] [--out bench/results/export_memory_cpu.md]
"""
import argparse, os, shutil, statistics, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(__file__))
from machine import cpu_model

MODELS = {  # name: (strategy, --set overrides); about 150-180M parameters, seq 32, one step
    "llama": ("examples/strategies/llama_text.toml",
              ["model.n_layer=16", "model.d_model=1024", "model.n_head=16", "model.n_kv_head=4"]),
    "gpt": ("examples/strategies/default.toml",
            ["model.n_layer=12", "model.d_model=1024", "model.n_head=16"]),
    "mixtral": ("examples/strategies/mixtral.toml",
                ["model.n_layer=4", "model.d_model=768", "model.ffn_hidden=2048", "model.n_head=12", "model.n_kv_head=4"]),
}
COMMON = ["job.steps=1", "job.global_batch=2", "job.micro_batch=2", "job.eval_every=0", "job.checkpoint_every=1",
          "job.threads=2", "model.seq_len=32", "parallel.expert=1"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/export_memory_cpu.md")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="export_memory.")
    try:
        cases, weights, files = [], {}, {}
        for name, (strategy, sets) in MODELS.items():
            run = os.path.join(work, name)
            command = [args.strata, "run", strategy, "--out", run]
            for s in COMMON + sets:
                command += ["--set", s]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for dtype, shard in (("fp32", "5GB"), ("bf16", "5GB"), ("bf16", "100MB")):
                cases.append((name, dtype, shard))
        peaks = {case: [] for case in cases}
        # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: each export runs under a fresh
        # python that reports its own child's peak.
        probe = ("import resource,subprocess,sys; subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL);"
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        for _ in range(args.rounds):
            for case in cases:
                name, dtype, shard = case
                out = os.path.join(work, "hf")
                shutil.rmtree(out, ignore_errors=True)
                kib = subprocess.run([sys.executable, "-c", probe, args.strata, "ckpt", "export", os.path.join(work, name), out,
                                      "--dtype", dtype, "--max-shard-size", shard], check=True, capture_output=True, text=True).stdout
                peaks[case].append(int(kib) / 1024)
                written = [f for f in os.listdir(out) if f.endswith(".safetensors")]
                weights[case] = sum(os.path.getsize(os.path.join(out, f)) for f in written)
                files[case] = len(written)
        lines = ["# `strata ckpt export`: peak memory against the model (CPU)", "",
                 f"Command: `python3 bench/export_memory.py --rounds {args.rounds}`  ",
                 f"Machine: {cpu_model()}, {os.cpu_count()} cores. Each model trained one step on one process (seq 32) and",
                 "saved; each export's peak resident set (ru_maxrss of the exporting process), the median of "
                 f"{args.rounds} interleaved rounds.",
                 "fp32 model = the parameters in fp32 (what the export fills from the checkpoint); weights = the files written.", "",
                 "| model | --dtype | --max-shard-size | files | fp32 model MiB | weights MiB | peak MiB | peak / fp32 model |",
                 "|---|---|---|---|---|---|---|---|"]
        for case in cases:
            name, dtype, shard = case
            fp32_mib = weights[(name, "fp32", "5GB")] / 2**20
            peak = statistics.median(peaks[case])
            lines.append(f"| {name} | {dtype} | {shard} | {files[case]} | {fp32_mib:.0f} | {weights[case] / 2**20:.0f} | {peak:.0f} | {peak / fp32_mib:.2f} |")
        text = "\n".join(lines) + "\n"
        with open(args.out, "w") as f:
            f.write(text)
        print(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
