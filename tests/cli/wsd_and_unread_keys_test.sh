#!/usr/bin/env bash
# [optimizer] schedule = "wsd" (warmup-stable-decay, engine/schedule.h): the learning rate of every
# step in metrics.jsonl against the formula, for linear and sqrt decay shapes; a resume from a
# stable-phase checkpoint with more steps moves the decay to the new end. Keys stated for a
# feature whose switch the strategy left out (wsd's decay, evaluations, snapshot replicas,
# restarts) are refused at plan time, naming the switch (unread_keys.h), as is a token
# directory's val_fraction; a strategy that states the switch off plans, and a saved strategy
# (every key stated) resumes.
# usage: wsd_and_unread_keys_test.sh STRATA DEFAULT_TOML WORK_DIR
set -uo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "FAIL: $*"; fail=1; }
tiny=(--disable ddp --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32 --set job.global_batch=2
  --set job.threads=1 --set job.log_every=1 --set job.eval_every=0 --set optimizer.lr=1e-3 --set optimizer.warmup_steps=2
  --set optimizer.min_lr_ratio=0.1 --set 'optimizer.schedule="wsd"' --set optimizer.decay_fraction=0.3)
# expect_lrs RUN_DIR SHAPE TOTAL FIRST_STEP: every logged step's lr against the formula (10 steps,
# warmup 2, the last round(0.3 x TOTAL) steps decaying).
expect_lrs() {
  python3 - "$@" <<'PY' || fail=1
import json, math, sys
run, shape, total, first = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lr, warmup, min_lr = 1e-3, 2, 1e-4
start = max(warmup, total - round(0.3 * total))
def expected(step):
    if step <= warmup: return lr * step / warmup
    if step <= start: return lr
    p = (step - start) / (total - start)
    f = {"linear": 1 - p, "sqrt": 1 - math.sqrt(p), "cosine": 0.5 * (1 + math.cos(math.pi * p))}[shape]
    return min_lr + (lr - min_lr) * f
seen = {r["step"]: r["lr"] for r in map(json.loads, open(f"{run}/metrics.jsonl")) if "lr" in r}
steps = list(range(first, total + 1))
bad = [(s, seen.get(s), expected(s)) for s in steps if s not in seen or abs(seen[s] - expected(s)) > 1e-12]
if bad:
    sys.exit(f"FAIL {run}: step, lr, expected: {bad}")
print(f"ok {run}: {shape}, steps {first}..{total}, decay from step {start + 1}")
PY
}
"$strata" run "$strategy" "${tiny[@]}" --set job.steps=10 --set job.checkpoint_every=5 --out "$work/linear" > "$work/linear.log" 2>&1 ||
  check "the wsd run failed: $(tail -3 "$work/linear.log")"
expect_lrs "$work/linear" linear 10 1
"$strata" run "$strategy" "${tiny[@]}" --set job.steps=10 --set 'optimizer.decay_shape="sqrt"' --set job.checkpoint_every=0 \
  --out "$work/sqrt" > "$work/sqrt.log" 2>&1 || check "the sqrt run failed: $(tail -3 "$work/sqrt.log")"
expect_lrs "$work/sqrt" sqrt 10 1
# Resumed from step 5 (stable) with 20 steps: its saved strategy states every key; steps 6..20
# follow the 20-step schedule (decay from step 15).
rm -rf "$work/linear/checkpoints/step_00000010"
"$strata" run "$work/linear/strategy.toml" --out "$work/linear" --resume --set job.steps=20 > "$work/resume.log" 2>&1 ||
  check "the resume failed: $(tail -3 "$work/resume.log")"
grep -q "step_00000005" "$work/resume.log" || check "did not resume from step 5: $(grep -i resum "$work/resume.log")"
expect_lrs "$work/linear" linear 20 6
# A key stated for a feature whose switch the strategy left out: refused, one line each, exit 2,
# naming the switch. Stating the switch off (as `--set` does, or a saved strategy) is accepted.
cat > "$work/bare.toml" <<'TOML'
[job]
model = "gpt"
dataset = "text"
steps = 2
global_batch = 2
threads = 1
[model]
n_layer = 1
n_head = 2
d_model = 32
vocab_size = 256
seq_len = 32
[data]
path = "data/kjv.txt"
TOML
refused() {  # refused PATTERN ARGS...: strata plan bare.toml ARGS is refused with one line matching PATTERN
  local pattern=$1; shift
  local msg status
  msg=$("$strata" plan "$work/bare.toml" "$@" 2>&1); status=$?
  [ $status -eq 2 ] && [ "$(grep -c error <<<"$msg")" -eq 1 ] && grep -q -- "$pattern" <<<"$msg" || check "not refused as '$pattern' (exit $status): $msg"
}
accepted() {  # accepted ARGS...: strata plan bare.toml ARGS plans, with no note of an unread key
  "$strata" plan "$work/bare.toml" "$@" > "$work/accepted.log" 2>&1 || check "refused: $* : $(grep error "$work/accepted.log")"
  ! grep -q "is not read" "$work/accepted.log" || check "a note where every key is read: $* : $(grep note "$work/accepted.log")"
}
noted() {  # noted NOTE ARGS...: strata plan bare.toml ARGS plans and notes, on standard error, the one key nothing reads
  local note=$1; shift
  "$strata" plan "$work/bare.toml" "$@" > "$work/noted.out" 2> "$work/noted.err" || check "refused: $* : $(grep error "$work/noted.err")"
  [ "$(grep -c "is not read" "$work/noted.err")" -eq 1 ] && grep -qxF "note: $note" "$work/noted.err" ||
    check "not noted as '$note': $* : $(cat "$work/noted.err")"
}
refused '--set optimizer.decay_fraction=0.5: error: \[optimizer\] decay_fraction = 0.5 applies to schedule = "wsd", and schedule is left at "cosine"; set schedule = "wsd"' \
  --set optimizer.decay_fraction=0.5
noted '[optimizer] decay_fraction = 0.5 is not read: schedule = "cosine"' --set optimizer.decay_fraction=0.5 --set 'optimizer.schedule="cosine"'
noted '[optimizer] min_lr_ratio = 0.05 is not read: schedule = "constant"' --set optimizer.min_lr_ratio=0.05 --set 'optimizer.schedule="constant"'
accepted --set 'optimizer.schedule="constant"'
refused 'error: \[job\] eval_batches = 2 sizes each evaluation, and eval_every is left at 0, which runs none; set eval_every' --set job.eval_batches=2
noted '[job] eval_batches = 2 is not read: eval_every = 0 runs no evaluation' --set job.eval_batches=2 --set job.eval_every=0
accepted --set job.eval_batches=2 --set job.eval_every=3
refused 'error: \[job\] snapshot_replicas = 1 replicates flash snapshots, and flash_every is left at 0, which takes none; set flash_every' \
  --set job.snapshot_replicas=1
noted '[job] snapshot_replicas = 1 is not read: flash_every = 0 takes no flash snapshot' --set job.snapshot_replicas=1 --set job.flash_every=0
refused 'error: \[job\] restart_backoff = 5.0 spaces restarts, and max_restarts is left at 0, which allows none; set max_restarts' \
  --set job.restart_backoff=5
noted '[job] restart_backoff = 5.0 is not read: max_restarts = 0 allows no restart' --set job.restart_backoff=5 --set job.max_restarts=0
refused 'error: \[job\] min_ranks = 2 bounds the ranks a restart or the health check.s exclusion may leave, and max_restarts and health_check are left at 0 and "off"; set either' \
  --set job.min_ranks=2
accepted --set job.min_ranks=2 --set 'job.health_check="exclude"'
noted '[job] min_ranks = 2 is not read: max_restarts = 0 and health_check = "off" leave no rank out' --set job.min_ranks=2 \
  --set 'job.health_check="off"'
# strata plan --json lists them under "unread_keys" (standard output stays one document).
"$strata" plan "$work/bare.toml" --json --set job.eval_batches=2 --set job.eval_every=0 2>/dev/null |
  python3 -c 'import json, sys; keys = json.load(sys.stdin)["unread_keys"]; sys.exit(keys != ["[job] eval_batches = 2 is not read: eval_every = 0 runs no evaluation"])' ||
  check "strata plan --json does not list the unread key"
# strata run notes it once, from rank 0, before training; the run's saved strategy, which states
# every key, notes it again on resume.
{ cat "$work/bare.toml"; printf '[[pass]]\nname = "ddp"\n'; } > "$work/ddp.toml"
"$strata" run -n 2 "$work/ddp.toml" --set job.steps=2 --set job.eval_batches=2 --set job.eval_every=0 --out "$work/noted_run" \
  > "$work/noted_run.out" 2> "$work/noted_run.err" || check "the noted run failed: $(tail -3 "$work/noted_run.err")"
[ "$(grep -c "^strata: note: \[job\] eval_batches = 2 is not read: eval_every = 0 runs no evaluation$" "$work/noted_run.err")" -eq 1 ] ||
  check "strata run -n 2 did not note the unread key once: $(cat "$work/noted_run.err")"
"$strata" plan "$work/noted_run/strategy.toml" 2>&1 >/dev/null | grep -q "note: \[job\] eval_batches = 2 is not read" ||
  check "the saved strategy's plan does not note the unread key"
# A token directory's val.bin is its validation split: val_fraction is for a single file's tail.
mkdir -p "$work/bins" && head -c 8000 /dev/zero > "$work/bins/train.bin" && head -c 8000 /dev/zero > "$work/bins/val.bin"
refused "error: \[data\] val_fraction holds out the tail of a single token file, and $work/bins is a directory, whose val.bin is the validation split" \
  --set 'job.dataset="tokens"' --set "data.path=\"$work/bins\"" --set data.val_fraction=0.1
accepted --set 'job.dataset="tokens"' --set "data.path=\"$work/bins/train.bin\"" --set data.val_fraction=0.1
[ $fail = 0 ] && echo "wsd schedule: every step's learning rate as the formula gives; unread keys refused"
exit $fail
