"""Random compositions of Strata's passes through the whole life of a run, on tiny models.

CTest proves each layout and many pairs of them; this samples the rest of the space. Each
composition (model gpt, llama or mixtral; ddp, zero1, zero2, fsdp, HSDP or none; tensor, pipeline,
context and expert parallel sizes with at most 4 ranks, with their passes' keys drawn too
(sequence parallel, the pipeline schedule, the context method, fsdp's reshard_after_forward,
fsdp's and zero2's reduce_every_micro_batch);
Mixtral's shared experts, bias balance and capacity; amp bf16/fp16; fp8 with each scaling recipe;
WSAM local, adaptive or global; act_checkpoint; fused_loss; AdamW, AGD or SGD; random weights or
`[model] init_from` a Hugging Face directory that one process's run exported) must either be
refused at plan time with exit status 2 and an error line, or:

  train     6 steps, a checkpoint every 3, finite losses;
  parity    where the run is exactly the single process's (fp32, WSAM's perturbation global or
            of one data rank, no capacity), every step's loss within a relative 1e-5 of one
            process without the parallel passes;
  resume    from the step-3 checkpoint with the strategy the run saved: steps 4-6 bit-equal;
  reshard   from the step-3 checkpoint in one process without the parallel passes, and in another
            random layout of the same run (where parity applies to both): steps 4-6 within 1e-5 of
            the uninterrupted run;
  export    `strata ckpt export`, loaded by transformers (AutoModelForCausalLM), a finite loss.

    ~/.local/share/strata/venv/bin/python bench/compositions.py [--seed S] [--count N]

writes bench/results/compositions_cpu.md (the command, the CPU, a row per composition) and exits
1 if any composition failed.
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

from machine import cpu_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATA = os.path.join(ROOT, "build", "bin", "strata")
TOLERANCE = 1e-5


def sample(rng, like=None):
    """A random composition; with `like`, another layout of the same run (its model, optimizer and passes)."""
    model = like["model"] if like else rng.choice(["gpt", "llama", "mixtral"])
    tensor = pipeline = context = 2
    while tensor * pipeline * context > 4:  # at most 4 ranks
        tensor, pipeline, context = (rng.choice([1, 1, 2]) for _ in range(3))
    data = rng.choice([d for d in (1, 2, 3, 4) if d * tensor * pipeline * context <= 4])
    expert = rng.choice([e for e in (1, 2) if data % e == 0]) if model == "mixtral" else 1
    shard = rng.choice(["ddp", "zero1", "zero2", "fsdp", "none"] + (["hsdp"] if data == 4 else []))
    # The layout passes' own keys, drawn with it.
    keys = {"tensor_parallel": [f"sequence_parallel = {rng.choice(['false', 'true'])}"],
            "pipeline_parallel": [f'schedule = "{rng.choice(["1f1b", "gpipe", "interleaved", "zero_bubble"])}"'],
            "context_parallel": [f'method = "{rng.choice(["auto", "ulysses", "ring", "2d"])}"'],
            "fsdp": [f"reshard_after_forward = {rng.choice(['true', 'false'])}",
                     f"reduce_every_micro_batch = {rng.choice(['true', 'false'])}"],
            "zero2": [f"reduce_every_micro_batch = {rng.choice(['true', 'false'])}"]}
    layout = dict(model=model, shard=shard, data=data, tensor=tensor, pipeline=pipeline, context=context, expert=expert, keys=keys)
    if like:
        return {**like, **layout}
    # Mixtral's routing: shared experts, DeepSeek-V3's bias balance, a capacity (tokens dropped per micro-batch).
    moe = [f"shared_experts = {rng.choice([0, 1])}", f'balance = "{rng.choice(["aux_loss", "bias"])}"']
    if rng.random() < 0.25:
        moe += ["capacity_factor = 1.5", f'expert_rows = "{rng.choice(["packed", "padded"])}"']
    c = dict(layout, moe=moe if model == "mixtral" else [], amp=rng.choice(["off", "off", "off", "bf16", "fp16"]), wsam=rng.choice(["off", "off", "local", "adaptive", "global"]),
             act_checkpoint=rng.random() < 0.3, fused_loss=rng.random() < 0.3, optimizer=rng.choice(["adamw", "adamw", "agd", "sgd"]))
    # fp8 (not compared with one process, as amp) and weights from a Hugging Face directory.
    c["fp8"] = rng.choice(["delayed", "current", "rowwise"]) if rng.random() < 0.2 else "off"
    c["init_from"] = rng.random() < 0.3 and exportable(c)
    return c


def exportable(c):
    """Whether transformers' class for the model holds it (Mixtral: no shared experts, the aux loss, no capacity)."""
    return c["model"] != "mixtral" or c["moe"][:2] == ["shared_experts = 0", 'balance = "aux_loss"'] and len(c["moe"]) == 2


def world(c):
    return c["data"] * c["tensor"] * c["pipeline"] * c["context"]


def exact(c):
    """Whether the run is the single process's run: fp32, no perturbation of each data rank's own and
    no capacity (which drops tokens per micro-batch)."""
    capacity = any(k.startswith("capacity_factor") for k in c["moe"])
    return c["amp"] == "off" and c["fp8"] == "off" and (c["wsam"] in ("off", "global") or c["data"] == 1) and not capacity


def strategy(c, layout=True, init_from=None, steps=6):
    """The strategy file of composition `c`; without `layout`, one process without the parallel passes;
    `init_from`: the Hugging Face directory its weights start from (default: the one `check` chose)."""
    init_from = init_from or c.get("init_dir")
    # Micro-batches of one sequence in every layout (a pipeline's too): Mixtral's balance loss is
    # of each micro-batch's tokens, so runs compare only at the same micro-batch. 12 sequences a
    # step: every data size divides them, and an interleaved pipeline's micro-batches (6 or 12 a
    # rank) are a multiple of its 2 stages.
    lines = ["[job]", f'model = "{c["model"]}"', 'dataset = "text"', f"steps = {steps}", "global_batch = 12", "micro_batch = 1", "log_every = 1",
             "eval_every = 0", "checkpoint_every = 3", "threads = 1", "", "[model]", "n_layer = 2", "vocab_size = 256",
             "seq_len = 32", "n_head = 4", "d_model = 64"]
    if c["model"] != "gpt":
        lines += ["n_kv_head = 2", "ffn_hidden = 96"]
    if c["model"] == "mixtral":
        lines += ["n_experts = 4", "top_k = 2"] + c["moe"]
    if init_from:
        lines += [f'init_from = "{init_from}"']
    lines += ["", "[data]", 'path = "data/kjv.txt"', "", "[optimizer]", f'name = "{c["optimizer"]}"', "lr = 1e-3"]
    passes = []
    if layout:
        lines += ["", "[parallel]", f"tensor = {c['tensor']}", f"pipeline = {c['pipeline']}", f"context = {c['context']}",
                  f"expert = {c['expert']}"]
        shard = c["shard"]
        if shard == "hsdp":
            passes.append(['name = "fsdp"', "shard_size = 2"] + c["keys"]["fsdp"])
        elif shard != "none":
            passes.append([f'name = "{shard}"'] + c["keys"].get(shard, []))
        elif c["data"] > 1:
            passes.append(['name = "ddp"'])
        for key, name in (("tensor", "tensor_parallel"), ("pipeline", "pipeline_parallel"), ("context", "context_parallel"),
                          ("expert", "expert_parallel")):
            if c[key] > 1:
                passes.append([f'name = "{name}"'] + c["keys"].get(name, []))
    if c["amp"] != "off":
        passes.append(['name = "amp"', f'dtype = "{c["amp"]}"'])
    if c["fp8"] != "off":
        passes.append(['name = "fp8"', f'recipe = "{c["fp8"]}"'])
    if c["wsam"] != "off":
        passes.append(['name = "wsam"', f'perturbation = "{"global" if c["wsam"] == "global" else "local"}"',
                       f'adaptive = {"true" if c["wsam"] == "adaptive" else "false"}'])
    if c["act_checkpoint"]:
        passes.append(['name = "act_checkpoint"'])
    if c["fused_loss"]:
        passes.append(['name = "fused_loss"'])
    for p in passes:
        lines += ["", "[[pass]]"] + p
    return "\n".join(lines) + "\n"


def strata(*args):
    return subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def worst(a, b, steps):
    return max(abs(a[s] - b[s]) / max(abs(b[s]), 1e-12) for s in steps)


def resume_from_step_3(full, to, strategy_path, ranks):
    shutil.copytree(full, to)
    shutil.rmtree(os.path.join(to, "checkpoints", "step_00000006"), ignore_errors=True)
    r = strata("run", "-n", str(ranks), strategy_path, "--out", to, "--resume")
    if r.returncode != 0 or "at step 3" not in r.stdout + r.stderr:
        raise RuntimeError("resume: " + (r.stderr.strip().splitlines() or ["no resume at step 3"])[-1])
    return losses(to)


def describe(c):
    """The layout in words, with the keys its passes were given."""
    used = {"tensor_parallel": c["tensor"] > 1, "pipeline_parallel": c["pipeline"] > 1, "context_parallel": c["context"] > 1,
            "fsdp": c["shard"] in ("fsdp", "hsdp"), "zero2": c["shard"] == "zero2"}
    keys = [k.replace('"', "").replace(" = ", "=") for name, ks in c["keys"].items() if used[name] for k in ks]
    return "%s, data %d, tensor %d, pipeline %d, context %d, expert %d%s" % (
        c["shard"], c["data"], c["tensor"], c["pipeline"], c["context"], c["expert"], (" (" + ", ".join(keys) + ")") if keys else "")


def initial_weights(c, references):
    """A Hugging Face directory of the model `c` trains: one process's step of it, exported (made
    once per model configuration)."""
    plain = dict(c, amp="off", fp8="off", wsam="off", act_checkpoint=False, fused_loss=False, optimizer="adamw")
    key = "init:" + strategy(plain, layout=False, steps=1)
    if key not in references:
        directory = tempfile.mkdtemp(prefix="strata-compositions-init-")
        with open(os.path.join(directory, "strategy.toml"), "w") as f:
            f.write(key[len("init:"):])
        r = strata("run", os.path.join(directory, "strategy.toml"), "--out", os.path.join(directory, "run"))
        if r.returncode == 0:
            r = strata("ckpt", "export", os.path.join(directory, "run"), os.path.join(directory, "hf"))
        if r.returncode != 0:
            raise RuntimeError("init_from: making the weights failed: " + (r.stderr.strip().splitlines() or [""])[-1][:200])
        references[key] = os.path.join(directory, "hf")
    return references[key]


def check(c, other, work, python, references):
    """Runs composition `c` through its life, resharding it to layout `other` too; returns (outcome, notes)."""
    init = None
    if c["init_from"]:
        try:
            init = initial_weights(c, references)
        except RuntimeError as e:
            return "FAILED", [str(e)]
    c, other = dict(c, init_dir=init), dict(other, init_dir=init)
    path = os.path.join(work, "strategy.toml")
    with open(path, "w") as f:
        f.write(strategy(c))
    full = os.path.join(work, "full")
    r = strata("run", "-n", str(world(c)), path, "--out", full)
    if r.returncode == 2 and "error" in r.stderr and "internal" not in r.stderr:
        return "refused", [r.stderr.strip().splitlines()[0]]
    if r.returncode != 0:
        return "FAILED", ["train: exit %d: %s" % (r.returncode, (r.stderr.strip().splitlines() or [""])[-1])]
    trained = losses(full)
    if len(trained) != 6 or not all(math.isfinite(v) for v in trained.values()):
        return "FAILED", ["train: losses %s" % trained]
    notes, failed = [], False
    if exact(c):
        key = strategy(c, layout=False)
        ref = os.path.join(work, "reference")
        with open(ref + ".toml", "w") as f:
            f.write(key)
        if key not in references:
            rr = strata("run", ref + ".toml", "--out", ref)
            references[key] = losses(ref) if rr.returncode == 0 else None
        ref = references[key]
        d = worst(trained, ref, range(1, 7)) if ref else math.inf
        failed |= not d <= TOLERANCE
        notes.append("parity %.1e" % d)
    try:
        resumed = resume_from_step_3(full, os.path.join(work, "cut"), os.path.join(full, "strategy.toml"), world(c))
        same = all(resumed[s] == trained[s] for s in (4, 5, 6))
        failed |= not same
        notes.append("resume " + ("exact" if same else "differs %.1e" % worst(resumed, trained, (4, 5, 6))))
        if exact(c):
            resharded = resume_from_step_3(full, os.path.join(work, "reshard"), os.path.join(work, "reference.toml"), 1)
            d = worst(resharded, trained, (4, 5, 6))
            failed |= not d <= TOLERANCE
            notes.append("reshard to 1 %.1e" % d)
            other_path = os.path.join(work, "other.toml")
            with open(other_path, "w") as f:
                f.write(strategy(other))
            planned = strata("plan", "-n", str(world(other)), other_path)
            if planned.returncode != 0:
                notes.append("reshard to %s: refused at plan time (%s)" % (describe(other), planned.stderr.strip().splitlines()[0][-160:]))
            elif exact(other):
                resharded = resume_from_step_3(full, os.path.join(work, "reshard_other"), os.path.join(work, "other.toml"), world(other))
                d = worst(resharded, trained, (4, 5, 6))
                failed |= not d <= TOLERANCE
                notes.append("reshard to %s %.1e" % (describe(other), d))
    except (RuntimeError, KeyError) as e:
        failed = True
        notes.append(str(e)[:200])
    exported = os.path.join(work, "hf")
    r = strata("ckpt", "export", full, exported)
    if r.returncode == 0:
        load = ("import sys, torch, transformers as t; m = t.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
                "x = torch.randint(0, 256, (1, 16)); print(float(m(x, labels=x).loss))")
        r = subprocess.run([python, "-c", load, exported], capture_output=True, text=True, timeout=600)
    if r.returncode == 2 and "error" in r.stderr:  # a model transformers cannot hold, refused in one line
        notes.append("export refused: " + r.stderr.strip().splitlines()[0][:200])
        return ("FAILED" if failed else "ok"), notes
    ok = r.returncode == 0 and math.isfinite(float((r.stdout.strip().splitlines() or ["nan"])[-1]))
    failed |= not ok
    notes.append("export loaded" if ok else "export: " + (r.stderr.strip().splitlines() or [""])[-1][:200])
    return ("FAILED" if failed else "ok"), notes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--results", default=os.path.join(ROOT, "bench", "results", "compositions_cpu.md"))
    args = parser.parse_args()
    python = os.path.expanduser("~/.local/share/strata/venv/bin/python")
    rng = random.Random(args.seed)
    references, rows, failures = {}, [], 0
    for i in range(args.count):
        c = sample(rng)
        other = sample(rng, like=c)
        with tempfile.TemporaryDirectory(prefix="strata-compositions-") as work:
            outcome, notes = check(c, other, work, python, references)
        failures += outcome == "FAILED"
        layout = describe(c)
        extras = ", ".join([c["optimizer"]] + [k.replace('"', "").replace(" = ", "=") for k in c["moe"]] + (["amp " + c["amp"]] if c["amp"] != "off" else []) +
                           (["fp8 " + c["fp8"]] if c["fp8"] != "off" else []) + (["wsam " + c["wsam"]] if c["wsam"] != "off" else []) +
                           (["init_from hf"] if c["init_from"] else []) +
                           [k for k in ("act_checkpoint", "fused_loss") if c[k]])
        row = "| %d | %s | %s | %s | %s | %s |" % (i, c["model"], layout, extras, outcome, "; ".join(notes))
        print(row, flush=True)
        rows.append(row)
    for key, directory in references.items():  # the Hugging Face directories made for init_from
        if key.startswith("init:"):
            shutil.rmtree(os.path.dirname(directory), ignore_errors=True)
    with open(args.results, "w") as f:
        f.write("# Random compositions through the life of a run (bench/compositions.py)\n\n")
        f.write("Command: `%s`  \nCPU: %s\n\n" % (" ".join(["python", "bench/compositions.py"] + sys.argv[1:]), cpu_model()))
        f.write("Each row: trained 6 steps; parity and reshard (to one process and to another layout) within %g where the run "
                "is exactly the single process's (fp32, WSAM's perturbation global or of one data rank, no capacity; amp "
                "and fp8 runs are not compared; with init_from the reference starts from the same weights); resumed with the saved strategy, steps 4-6 bit-equal; exported and loaded by "
                "transformers, or the export refused in one line where transformers' class cannot hold the model.\n\n" % TOLERANCE)
        f.write("| # | model | layout | optimizer and passes | outcome | checks |\n|---|---|---|---|---|---|\n")
        f.write("\n".join(rows) + "\n\n%d of %d failed.\n" % (failures, len(rows)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
