"""Tensor parallel (Megatron) and sequence parallel on CPU: model-state bytes per rank, activation
memory, bytes communicated per step and step time, each next to its formula.

usage: python bench/tensor_parallel.py [--strata build/bin/strata] [--out bench/results/tensor_parallel_cpu.md]
                                       [--repeats 5]

Model: GPT (learned positions wpe [seq_len, d], token embedding tied to the head), d_model 512,
8 heads, seq_len 512, vocabulary 256, no dropout, synthetic tokens, fp32 AdamW, one thread per
rank. Every configuration is one `strata run -n N` process group; the figures are Strata's
per-step metrics of the last step (metrics.jsonl, written by rank 0, each the maximum over ranks).

1. Model states. mem_params/grads/optimizer_bytes (each storage counted once, taken just before
   the optimizer step) of the 4-layer model at tensor 1, 2, 4, against 4/4/8 bytes per parameter
   held: Psi_split / t + Psi_repl, where Psi_split (token embedding = tied head, split by vocabulary
   rows; c_attn weight and bias, attention c_proj weight, c_fc weight and bias, MLP c_proj weight)
   and Psi_repl (positions wpe, the norms, the two row biases of each layer) are counted from the
   shapes and checked against `strata ckpt info` of a tensor-2 checkpoint (sliced vs whole).
2. Activations. mem_peak_bytes is the process's peak resident set (getrusage ru_maxrss, the
   whole process: libtorch, MPI, model states, activations, transients), not allocator bytes
   (the trainer reads no allocator statistics on CPU). Activation bytes per layer and sequence are
   the double difference of four runs (2 and 4 layers x micro-batch 2 and 6):
       [peak(4, 6) - peak(4, 2) - peak(2, 6) + peak(2, 2)] / ((4 - 2) (6 - 2)),
   which cancels everything that does not grow with both layers and batch (libtorch and MPI,
   model states, the embedding, head and loss, backward's transient buffers). These runs set
   MALLOC_MMAP_THRESHOLD_=65536 so that glibc serves tensors from mmap and returns them at
   free: the peak RSS then follows live tensor bytes instead of the heap's high-water mark
   (a control run at tensor 1 without it is reported). Compared with Korthikanti et al. 2022
   (per layer, 2-byte activations): sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)) with tensor
   parallel, sbh/t (34 + 5as/h) with sequence parallel, adapted to what Strata keeps (below).
3. Communication. tp_all_reduce_bytes, tp_all_gather_bytes, tp_reduce_scatter_bytes (the tensor
   sizes this rank's tensor-parallel collectives moved in the step, forward and backward) of
   every run of 2., against the formula for this model, exactly.
4. Step time, tensor 2 (with and without sequence parallel) against data 2 (ddp) and one process,
   same model (4 layers) and global batch 6, 4 steps, median of steps 2-4 per run, runs
   alternating, median over --repeats rounds; glibc's default malloc. The results also give the
   share of the machine's CPU time that other processes used meanwhile (/proc/stat minus this
   script's children), to tell whether the timings were taken on a shared machine.
"""
import argparse
import json
import os
import pathlib
import platform
import re
import resource
import statistics
import subprocess
import tempfile
import time

D, HEADS, SEQ, VOCAB = 512, 8, 512, 256
LAYERS = (2, 4)           # the activation double difference: layers ...
BATCHES = (2, 6)          # ... and micro-batch (sequences per step; data size 1)
MEM_STEPS = 2
LAYOUTS = [(1, False), (2, False), (2, True), (4, False), (4, True)]  # (tensor, sequence_parallel)
TIMING = [("one process", 1, 1, False, None), ("tensor 2", 2, 2, False, "tensor"), ("tensor 2 + SP", 2, 2, True, "tensor"),
          ("data 2 (ddp)", 2, 1, False, "ddp")]  # label, ranks, tensor, sp, pass
TIMING_LAYERS, TIMING_BATCH, TIMING_STEPS = 4, 6, 4
MMAP = "65536"
MIB = 1024.0 * 1024.0

STRATEGY = """
[job]
model = "gpt"
dataset = "synthetic"
steps = {steps}
global_batch = {batch}
log_every = 100
eval_every = 0
checkpoint_every = 0
threads = 1
[model]
n_layer = {layers}
n_head = {heads}
d_model = {d}
vocab_size = {vocab}
seq_len = {seq}
[data]
vocab_size = {vocab}
[parallel]
tensor = {tensor}
data = "auto"
"""
TP_PASS = """[[pass]]
name = "tensor_parallel"
sequence_parallel = {sp}
"""
DDP_PASS = """[[pass]]
name = "ddp"
"""


def strategy(layers, batch, tensor, sp, steps, extra_pass=None):
    text = STRATEGY.format(steps=steps, batch=batch, layers=layers, heads=HEADS, d=D, vocab=VOCAB, seq=SEQ, tensor=tensor)
    if tensor > 1:
        text += TP_PASS.format(sp=str(sp).lower())
    if extra_pass == "ddp":
        text += DDP_PASS
    return text


def run_strategy(strata, work, label, text, ranks, mmap):
    """Trains strategy `text` on `ranks` ranks; returns the run directory and its metrics records."""
    path = work / f"{label}.toml"
    path.write_text(text)
    out = work / label
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mmap:
        env["MALLOC_MMAP_THRESHOLD_"] = MMAP
    subprocess.run([strata, "run", "-n", str(ranks), str(path), "--out", str(out)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ---- formulas -------------------------------------------------------------------------------

def parameter_split(layers):
    """(split, replicated) parameter counts of the GPT from its shapes."""
    d, vocab, seq = D, VOCAB, SEQ
    per_layer_split = 3 * d * d + 3 * d + d * d + 4 * d * d + 4 * d + 4 * d * d   # c_attn w+b, attn c_proj w, c_fc w+b, mlp c_proj w
    per_layer_repl = 2 * d + 2 * d + d + d                                     # ln_1, ln_2 (w+b), the two row biases
    return vocab * d + layers * per_layer_split, seq * d + layers * per_layer_repl + 2 * d  # wte; wpe, layers, ln_f


def activation_strata(t, sp):
    """Bytes per layer and sequence that Strata's fp32 autograd keeps, in units of s*h (b = 1).

    Replicated over the tensor group without SP: the inputs of ln_1 and ln_2 (8) and of c_attn and
    c_fc (the norms' outputs, 8). Split: q, k, v (12/t, views of c_attn's output that SDPA keeps),
    attention output = c_proj's input (4/t), GELU input (16/t) and output (16/t). Small: SDPA's
    logsumexp (4a/(h t)) and the norms' mean and rstd (16/h). With SP the norm inputs and stats
    are this rank's tokens (/t), but c_attn and c_fc keep their all-gathered whole input (8)."""
    d, heads = D, HEADS
    norms, columns, split = 8.0, 8.0, 48.0 / t
    small = 4.0 * heads / (d * t) + 16.0 / d
    if sp:
        norms /= t
        small = 4.0 * heads / (d * t) + 16.0 / (d * t)
    return norms + columns + split + small


def activation_paper(t, sp):
    """Korthikanti et al. per layer, 2-byte activations, sbh units."""
    a, s, h = HEADS, SEQ, D
    if t == 1:
        return 34 + 5 * a * s / h
    if sp:
        return (34 + 5 * a * s / h) / t
    return 10 + 24 / t + 5 * a * s / (h * t)


def activation_paper_fp32(t, sp):
    """The paper's terms in fp32 (4 bytes, twice its 2), without dropout masks (dropout 0: its 2sbh
    of 1-byte masks and the 5as/h softmax/dropout terms' masks) and without the softmax (SDPA keeps
    no as^2b scores): 64, 16 + 48/t, 64/t; the paper's SP keeps the norm outputs' shard only and
    all-gathers again in backward."""
    if t == 1:
        return 64.0
    return 64.0 / t if sp else 16.0 + 48.0 / t


def communication(t, sp, layers, b):
    """Predicted (all-reduce, all-gather, reduce-scatter) bytes per step and rank, fp32, as Strata
    counts them (all-reduce the tensor, all-gather the gathered output, reduce-scatter the input)."""
    s, h = SEQ, D
    if t == 1:
        return 0, 0, 0
    act = 4 * b * s * h               # one [b, s, h] fp32 activation
    loss = 3 * 4 * b * s              # vocab-parallel cross entropy: max, sum of exp, target logit per token
    per_step = act * (4 * layers + 2)  # per layer 2 forward + 2 backward; embedding fwd + head bwd (or ln_f)
    if not sp:
        return per_step + loss, 0, 0
    # SP: the same activations as all-gathers and reduce-scatters; the positions' gradient [s, h]
    # all-gathered; norm weights/biases and row biases (6 per layer + ln_f's 2, [h] each) all-reduced.
    return loss + 4 * h * (6 * layers + 2), per_step + 4 * s * h, per_step


# ---- measurement ----------------------------------------------------------------------------

def checkpoint_split(strata, run_dir):
    """(split, replicated) model elements from `strata ckpt info` of a tensor-parallel checkpoint."""
    info = subprocess.run([strata, "ckpt", "info", str(run_dir)], check=True, capture_output=True, text=True).stdout
    split = repl = 0
    for name, shape, kind in re.findall(r"^  model/(\S+)  \w+ \[([\d, ]*)\]  (whole|sliced)", info, re.M):
        n = 1
        for dim in shape.split(","):
            n *= int(dim)
        if kind == "sliced":
            split += n
        else:
            repl += n
    total = int(re.search(r"^  model: \d+ tensors, (\d+) elements$", info, re.M).group(1))
    return split, repl, total


def memory_grid(strata, work, t, sp, mmap=True):
    runs = {}
    for layers in LAYERS:
        for b in BATCHES:
            label = f"mem_t{t}_{'sp' if sp else 'nosp'}_{'mmap' if mmap else 'default'}_L{layers}_b{b}"
            started = time.time()
            out, records = run_strategy(strata, work, label, strategy(layers, b, t, sp, MEM_STEPS), t, mmap)
            runs[layers, b] = (out, records[-1])
            print(f"  {label}: peak {records[-1]['mem_peak_bytes'] / MIB:.1f} MiB, loss {records[-1]['loss']:.6f}, "
                  f"{time.time() - started:.1f} s", flush=True)
    (l1, l2), (b1, b2) = LAYERS, BATCHES
    peak = {k: v[1]["mem_peak_bytes"] for k, v in runs.items()}
    per_layer_seq = (peak[l2, b2] - peak[l2, b1] - peak[l1, b2] + peak[l1, b1]) / ((l2 - l1) * (b2 - b1))
    return runs, per_layer_seq


def cpu_seconds():
    """(busy CPU seconds of the whole machine, steal seconds, CPU seconds of this script's finished children)."""
    fields = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (user + nice + system + irq + softirq) / tick, steal / tick, children.ru_utime + children.ru_stime


def other_work(before, after, wall):
    """Share of the machine's CPU time (cores x wall) that processes other than this benchmark's used."""
    other = (after[0] - before[0]) - (after[2] - before[2])
    return max(other, 0.0) / (wall * os.cpu_count()), (after[1] - before[1]) / (wall * os.cpu_count())


def cpu_name():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--out", default="bench/results/tensor_parallel_cpu.md")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    began = time.time()
    cpu = [cpu_seconds()]
    sbh = SEQ * D  # s*h for one sequence
    l1, l2 = LAYERS
    b1, b2 = BATCHES
    grids, per_layer = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for t, sp in LAYOUTS:
            print(f"memory: tensor {t}{' + SP' if sp else ''}", flush=True)
            grids[t, sp], per_layer[t, sp] = memory_grid(args.strata, work, t, sp)
        print("memory: tensor 1, glibc default malloc (control)", flush=True)
        control_runs, control = memory_grid(args.strata, work, 1, False, mmap=False)
        ckpt_split, ckpt_repl, ckpt_total = checkpoint_split(args.strata, grids[2, False][l2, b2][0])
        cpu.append(cpu_seconds())
        timing_began = time.time()

        timings = {label: [] for label, *_ in TIMING}
        losses = {}
        for repeat in range(args.repeats):
            for label, ranks, t, sp, kind in TIMING:
                name = f"time_{label.replace(' ', '_').replace('+', 'p').replace('(', '').replace(')', '')}_{repeat}"
                text = strategy(TIMING_LAYERS, TIMING_BATCH, t, sp, TIMING_STEPS, extra_pass="ddp" if kind == "ddp" else None)
                _, records = run_strategy(args.strata, work, name, text, ranks, mmap=False)
                timings[label].append(statistics.median(r["step_ms"] for r in records[1:]))
                losses[label] = records[-1]["loss"]
                print(f"  {name}: {timings[label][-1]:.0f} ms/step", flush=True)
        cpu.append(cpu_seconds())
    memory_other, memory_steal = other_work(cpu[0], cpu[1], timing_began - began)
    timing_other, timing_steal = other_work(cpu[1], cpu[2], time.time() - timing_began)
    elapsed = time.time() - began

    # ---- 1. model states ----
    split, repl = parameter_split(l2)
    psi = split + repl
    assert (ckpt_split, ckpt_repl, ckpt_total) == (split, repl, psi), (ckpt_split, ckpt_repl, ckpt_total, split, repl)
    state_rows, excess = [], []
    for t, sp in [(1, False), (2, False), (4, False)]:
        record = grids[t, sp][l2, b2][1]
        held = split / t + repl
        excess.append((record["mem_params_bytes"] - 4 * held, record["mem_grads_bytes"] - 4 * held,
                       record["mem_optimizer_bytes"] - 8 * held))
        want = (4 * held, 4 * held, 8 * held)
        got = (record["mem_params_bytes"], record["mem_grads_bytes"], record["mem_optimizer_bytes"])
        same_sp = "" if t == 1 else (" (same with SP)" if all(grids[t, True][l2, b2][1][k] == record[k] for k in
                                                                ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes")) else " (differs with SP!)")
        state_rows.append(f"| {t}{same_sp} | {held:,.0f} | {got[0] / MIB:.3f} / {want[0] / MIB:.3f} | {got[1] / MIB:.3f} / {want[1] / MIB:.3f} | "
                          f"{got[2] / MIB:.3f} / {want[2] / MIB:.3f} | {sum(got) / MIB:.3f} | {sum(want) / MIB:.3f} | {sum(got) / sum(want):.6f} | "
                          f"{16 * psi / t / MIB:.3f} | {record['mem_peak_bytes'] / MIB:.0f} |")

    # ---- 2. activations ----
    act_rows, raw_rows = [], []
    base = per_layer[1, False]
    for t, sp in LAYOUTS:
        measured = per_layer[t, sp] / sbh
        predicted = activation_strata(t, sp)
        name = f"tensor {t}{' + SP' if sp else ''}"
        act_rows.append(f"| {name} | {measured:.2f} | {predicted:.2f} | {measured / predicted:.3f} | {activation_paper_fp32(t, sp):.0f} | "
                        f"{activation_paper(t, sp):.1f} | {per_layer[t, sp] * b2 / MIB:.1f} | {per_layer[t, sp] / base:.3f} | "
                        f"{activation_strata(t, sp) / activation_strata(1, False):.3f} |")
        peaks = grids[t, sp]
        raw_rows.append(f"| {name} | " + " | ".join(f"{peaks[k][1]['mem_peak_bytes'] / MIB:.1f}" for k in
                                                  [(l1, b1), (l1, b2), (l2, b1), (l2, b2)]) +
                        f" | {(peaks[l2, b2][1]['mem_peak_bytes'] - peaks[l2, b1][1]['mem_peak_bytes']) / (b2 - b1) / MIB:.1f} | "
                        f"{peaks[l2, b2][1]['loss']:.6f} |")
    raw_rows.append("| tensor 1, default malloc (control) | " + " | ".join(
        f"{control_runs[k][1]['mem_peak_bytes'] / MIB:.1f}" for k in [(l1, b1), (l1, b2), (l2, b1), (l2, b2)]) +
        f" | {(control_runs[l2, b2][1]['mem_peak_bytes'] - control_runs[l2, b1][1]['mem_peak_bytes']) / (b2 - b1) / MIB:.1f} | "
        f"{control_runs[l2, b2][1]['loss']:.6f} |")

    # ---- 3. communication ----
    comm_rows, exact, checked = [], 0, 0
    for t, sp in LAYOUTS[1:]:
        for layers in LAYERS:
            for b in BATCHES:
                record = grids[t, sp][layers, b][1]
                got = (record["tp_all_reduce_bytes"], record["tp_all_gather_bytes"], record["tp_reduce_scatter_bytes"])
                want = communication(t, sp, layers, b)
                checked += 1
                exact += got == tuple(float(x) for x in want)
                if (layers, b) == (l2, b2):
                    comm_rows.append(f"| tensor {t}{' + SP' if sp else ''} | {got[0]:,.0f} / {want[0]:,} | {got[1]:,.0f} / {want[1]:,} | "
                                     f"{got[2]:,.0f} / {want[2]:,} | {sum(got) / MIB:.2f} | {'yes' if got == tuple(float(x) for x in want) else 'NO'} |")

    # ---- 4. step time ----
    med = {label: statistics.median(v) for label, v in timings.items()}
    time_rows = [f"| {label} | {ranks} | {' / '.join(f'{x:.0f}' for x in timings[label])} | {med[label]:.0f} | "
                 f"{med['one process'] / med[label]:.2f} | {losses[label]:.6f} |" for label, ranks, *_ in TIMING]
    spread = max(max(v) / min(v) for v in timings.values())
    ratio = med["tensor 2"] / med["data 2 (ddp)"]
    tp_bytes = communication(2, False, TIMING_LAYERS, TIMING_BATCH)[0]
    ddp_bytes = 4 * sum(parameter_split(TIMING_LAYERS))

    shared = max(memory_other, timing_other) > 0.05
    sp2 = per_layer[2, True] / sbh
    lines = [
        f"# Tensor parallel and sequence parallel on CPU ({platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, fp32 AdamW)", "",
        "Command: `~/.local/share/strata/venv/bin/python bench/tensor_parallel.py` (from the repository root; "
        f"{elapsed / 60:.1f} min).",
        f"GPT d_model {D}, {HEADS} heads, seq_len {SEQ}, vocabulary {VOCAB} (token embedding tied to the head, learned positions "
        f"wpe [{SEQ}, {D}]), no dropout, synthetic tokens, one thread per rank, mpi communicator. s = {SEQ}, h = {D}, a = {HEADS}.",
        "Every configuration is one `strata run -n N`; figures are the last step's metrics (written by rank 0, each the maximum over ranks).",
        f"Other processes than this benchmark's used {100 * memory_other:.0f}% of the machine's CPU time during the memory runs and "
        f"{100 * timing_other:.0f}% during the timing runs (/proc/stat minus the benchmark's own children; hypervisor steal "
        f"{100 * memory_steal:.0f}% / {100 * timing_steal:.0f}%)"
        + (": the machine was shared while these figures were taken (memory figures are unaffected; step times are)."
           if shared else "."), "",
        "## 1. Model states per rank", "",
        f"{l2} layers: Ψ = {psi:,} parameters = Ψ_split {split:,} + Ψ_repl {repl:,}.",
        f"Ψ_split = V·d + L·(12d² + 7d) (wte = tied head by vocabulary rows; c_attn weight and bias, attention c_proj weight, c_fc",
        f"weight and bias, MLP c_proj weight); Ψ_repl = s·d + L·6d + 2d (wpe, ln_1, ln_2, the two row biases, ln_f). Checked",
        f"against `strata ckpt info` of a tensor-2 checkpoint: {ckpt_split:,} elements sliced, {ckpt_repl:,} whole.",
        "Predicted per rank: params 4(Ψ_split/t + Ψ_repl), grads the same, AdamW state 8(Ψ_split/t + Ψ_repl) bytes.",
        "Measured: `mem_params_bytes`, `mem_grads_bytes`, `mem_optimizer_bytes` just before the optimizer step",
        f"({l2} layers, batch {b2}). The naive 16Ψ/t (every parameter split) is shown for scale; peak RSS is the whole process.", "",
        "| tensor t | parameters held per rank | params MiB measured / predicted | grads MiB | optimizer MiB | states MiB | predicted MiB | ratio | 16Ψ/t MiB | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|"] + state_rows + [
        "",
        "Measured minus predicted, bytes (params, grads, optimizer) at t = 1, 2, 4: "
        + "; ".join(f"{p:.0f}, {g:.0f}, {o:.0f}" for p, g, o in excess) + " (the optimizer's extra 8 bytes: AdamW's step counter). "
        f"Replicated parameters are {100 * repl / psi:.1f}% of Ψ here (wpe alone {SEQ * D:,}), so at t = 4 a rank holds "
        f"{(split / 4 + repl) / (psi / 4):.3f}x Ψ/4.", "",
        "## 2. Activation memory per layer", "",
        "Measured: peak RSS double difference over 2 and 4 layers and micro-batch 2 and 6 (see the script's docstring), in bytes",
        f"per layer and sequence, divided by s·h = {sbh:,} (\"sbh units\", b = 1). The four runs of each row set",
        f"MALLOC_MMAP_THRESHOLD_={MMAP}.",
        "Strata's prediction (fp32, what its autograd keeps; see `activation_strata` in the script):",
        "* tensor 1: 64 + 4a/h + 16/h = LayerNorm inputs 8 + c_attn and c_fc inputs 8 + q, k, v 12 + attention output",
        "  (= c_proj input) 4 + GELU input 16 + GELU output 16, plus SDPA's logsumexp (4a/h) and the norms' mean/rstd (16/h);",
        "* tensor t: 16 + 48/t + 4a/(ht) + 16/h (norm and column inputs replicated, the rest split);",
        "* tensor t + SP: 8/t + 8 + 48/t + 4a/(ht) + 16/(ht): the norm inputs are split by tokens, but c_attn and c_fc keep",
        "  their all-gathered whole input (the gather's output is the Linear's saved input).",
        "Korthikanti et al. (2-byte activations, with dropout): 34 + 5as/h; 10 + 24/t + 5as/(ht); (34 + 5as/h)/t. In Strata's",
        "setting: values are fp32 (x2), no dropout masks are stored (dropout 0: the paper's 2sbh of masks and the as²b mask go),",
        "and attention is ATen's SDPA (flash kernel on CPU), which keeps q, k, v, its output and a logsumexp, never the",
        "a·s² scores or softmax (the 5as/h terms go). The paper adapted so: 64; 16 + 48/t; 64/t. The paper's sequence",
        "parallel keeps only this rank's shard of the norm outputs and all-gathers them again in backward; Strata keeps the",
        "gathered tensor, so its SP row is 8(1 - 1/t) sbh above the adapted paper figure.", "",
        f"| layout | measured (sbh units) | Strata prediction | measured / prediction | paper adapted (fp32, no dropout, SDPA) | paper as written (2-byte) | measured MiB per layer at b = {b2} | measured vs tensor 1 | predicted vs tensor 1 |",
        "|---|---|---|---|---|---|---|---|---|"] + act_rows + [
        "",
        f"Control: tensor 1 with glibc's default malloc gives {control / sbh:.2f} sbh units for the same double difference "
        f"(the heap's high-water mark and reuse, not live bytes): this is why the runs above fix the mmap threshold.",
        f"With the paper's 5as/h score terms stored (fp32, 4as/h = {4 * HEADS * SEQ / D:.0f} more at t = 1) the measured figure would be "
        f"about {64 + 4 * HEADS * SEQ / D:.0f}; it is not.", "",
        f"Peak RSS (MiB) of the four runs of each layout, the per-sequence slope at {l2} layers (which also holds embedding, head,",
        f"loss and backward transients), and the loss at step {MEM_STEPS} of the largest run (tensor-parallel runs match one process):", "",
        f"| layout | L{l1} b{b1} | L{l1} b{b2} | L{l2} b{b1} | L{l2} b{b2} | MiB per sequence at L{l2} | loss |",
        "|---|---|---|---|---|---|---|"] + raw_rows + [
        "",
        "## 3. Bytes communicated per step and rank", "",
        "Strata counts the tensor of an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter",
        "(a ring all-reduce sends 2(t-1)/t of its tensor per rank on the wire, an all-gather or reduce-scatter (t-1)/t).",
        "With A = 4bsh (one fp32 [b, s, h] activation), for this model and L layers:",
        "* tensor parallel: all-reduce A(4L + 2) + 12bs: per layer 2 forward (attention and MLP c_proj outputs) and 2",
        "  backward (c_attn and c_fc input gradients), the vocab-parallel embedding's output forward and the tied head's",
        "  input gradient backward, and the loss's three per-token scalars (max, sum of exponentials, target logit);",
        "* tensor + sequence parallel: the same A(4L + 2) as reduce-scatters (row outputs and embedding forward, norm-output",
        "  gradients backward) and as all-gathers (norm outputs forward incl. ln_f, row-output gradients and embedding",
        "  backward), all-gather + 4sh for the positions' gradient, all-reduce 12bs + 4h(6L + 2) (loss scalars; ln_1, ln_2",
        "  weight and bias and the two row biases per layer, and ln_f, whose gradients are summed over the tensor group).",
        f"Measured = predicted exactly in {exact} of {checked} runs (every run of section 2 with t > 1). At {l2} layers, batch {b2}",
        "(measured / predicted bytes):", "",
        "| layout | all-reduce | all-gather | reduce-scatter | total MiB | exact |",
        "|---|---|---|---|---|---|"] + comm_rows + [
        "",
        "The per-rank counts do not depend on t (each rank's collectives move whole activations); the wire bytes do. Under SP the",
        "counted total is twice the all-reduce total because an all-reduce is a reduce-scatter plus an all-gather: on a ring",
        "both send 2(t-1)/t of A(4L + 2) per rank.", "",
        "## 4. Step time: tensor 2 vs data 2", "",
        f"{TIMING_LAYERS} layers, global batch {TIMING_BATCH} (ddp: {TIMING_BATCH // 2} sequences per rank), {TIMING_STEPS} steps, "
        f"one thread per rank, glibc's default malloc; per run the median of steps 2-{TIMING_STEPS}, runs in the order of the table, "
        f"repeated {args.repeats} times.", "",
        "| configuration | ranks | ms/step per repeat | median ms/step | speedup vs one process | loss at last step |",
        "|---|---|---|---|---|---|"] + time_rows + [
        "",
        f"Per step, tensor 2 all-reduces {tp_bytes / MIB:.1f} MiB of activations in {4 * TIMING_LAYERS + 2 + 3} blocking collectives "
        f"({4 * TIMING_LAYERS + 2} of {4 * TIMING_BATCH * SEQ * D / MIB:.1f} MiB) on the critical path, and computes the replicated part "
        f"(norms, residual adds, positions) on both ranks; ddp all-reduces the {ddp_bytes / MIB:.1f} MiB of gradients in buckets "
        f"during backward. Median step: tensor 2 {med['tensor 2']:.0f} ms, tensor 2 + SP {med['tensor 2 + SP']:.0f} ms, "
        f"data 2 {med['data 2 (ddp)']:.0f} ms (tensor 2 / data 2 = {med['tensor 2'] / med['data 2 (ddp)']:.2f}), one process "
        f"{med['one process']:.0f} ms. Repeats of one configuration differ by up to {spread:.2f}x (slowest / fastest), "
        + ("so differences between the medians smaller than that are noise of this " + ("shared " if shared else "") + "machine."
           if spread > max(ratio, 1 / ratio) else "less than tensor 2 and data 2 differ."),
    ] + ([f"Neither 2-rank layout was faster than one process: with other work using {100 * timing_other:.0f}% of the "
          f"{os.cpu_count()} cores, the two single-threaded ranks most likely did not have a core each while these ran."]
         if min(med["tensor 2"], med["data 2 (ddp)"]) >= med["one process"] else []) + [
        "Both layouts split the step's FLOPs over two ranks; on this CPU tensor parallel's point is memory (sections 1 and 2):",
        f"at t = 2 with SP activations are {sp2 / (per_layer[1, False] / sbh):.2f}x, model states "
        f"{(split / 2 + repl) / psi:.2f}x of one process, where ddp keeps both whole on every rank.",
    ]
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
