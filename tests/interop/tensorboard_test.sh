#!/usr/bin/env bash
# tensorboard_test.sh STRATA PYTHON WORKDIR: [job] tensorboard = true writes event files that the
# tensorboard package's own reader (EventAccumulator) reads (issue 62 item 5): every step's loss,
# lr, grad_norm, step_ms, tokens_per_s and memory, val_loss at evaluations, MFU with peak_tflops
# (over every device's peak: the line naming it, on one rank and on two),
# each value equal to metrics.jsonl's (as float32); on two ranks only rank 0 writes, and a resumed
# run adds a second file whose steps continue.
set -uo pipefail
strata=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "tensorboard_test: $1" >&2; fail=1; }
if ! "$python" -c "import tensorboard" 2>/dev/null; then
  echo "tensorboard_test: the tensorboard package is not in $python (scripts/setup installs it)" >&2; exit 1
fi
sets=(--set job.tensorboard=true --set job.steps=6 --set job.eval_every=3 --set job.checkpoint_every=3 --set job.threads=1
      --set job.peak_tflops=1 --set model.n_layer=1 --set model.seq_len=32 --set job.global_batch=4)
"$strata" run examples/strategies/single_process.toml --out "$work/one" "${sets[@]}" > "$work/one.txt" 2>&1 || check "run failed: $(tail -3 "$work/one.txt")"
"$strata" run examples/strategies/default.toml -n 2 --out "$work/two" "${sets[@]}" > "$work/two.txt" 2>&1 || check "2-rank run failed: $(tail -3 "$work/two.txt")"
"$strata" run "$work/two/strategy.toml" -n 2 --out "$work/two" --resume --set job.steps=9 > "$work/resume.txt" 2>&1 || check "resume failed: $(tail -3 "$work/resume.txt")"
# MFU divides by every device's peak: the run names the peak and, on two ranks, the devices.
grep -q "^mfu against 1.0 TFLOP/s per device (\[job\] peak_tflops)$" "$work/one.txt" || check "one rank: no 'mfu against' line"
grep -q "^mfu against 1.0 TFLOP/s per device x 2 devices (\[job\] peak_tflops)$" "$work/two.txt" || check "two ranks: no 'x 2 devices' line"
"$python" - "$work" <<'PY' || check "the event files do not hold what metrics.jsonl does"
import glob, json, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
work = sys.argv[1]
for run, steps, files in (("one", 6, 1), ("two", 9, 2)):
    paths = sorted(glob.glob(f"{work}/{run}/tensorboard/events.out.tfevents.*"))
    assert len(paths) == files, (run, paths)
    metrics = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
    seen = {}
    for path in paths:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):
                seen[(tag, e.step)] = e.value
    for tag in ("loss", "lr", "grad_norm", "step_ms", "tokens_per_s", "mfu", "mem_peak_bytes"):
        assert all((tag, s) in seen for s in range(1, steps + 1)), (run, tag, sorted(k for k in seen if k[0] == tag))
    assert sorted(s for (t, s) in seen if t == "val_loss") == [s for s in (3, 6, 9) if s <= steps], run
    for m in metrics:
        for key in ("loss", "lr", "grad_norm", "val_loss", "mem_peak_bytes"):
            if key in m:
                assert np.float32(m[key]) == np.float32(seen[(key, m["step"])]), (run, key, m["step"], m[key], seen[(key, m["step"])])
        assert abs(seen[("tokens_per_s", m["step"])] - m["tokens"] / (m["step_ms"] / 1000)) <= 1e-3 * seen[("tokens_per_s", m["step"])]
print("tensorboard events match metrics.jsonl")
PY
exit $fail
