#!/usr/bin/env bash
# run_dir_test.sh STRATA STRATEGY WORKDIR
# What happens to a run directory when a user is careless (issue 21, items 8-13 and 16): each
# case below failed before the run directory guard, the checked metrics writes and the resume
# fallback existed.
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=6 --set job.checkpoint_every=2 --set job.keep_checkpoints=3 --set job.eval_every=0
       --set job.global_batch=4 --set job.threads=1 --set model.n_layer=1 --set model.seq_len=32)
run=$work/run
fails() {  # fails REGEX COMMAND...: exit status 2 and REGEX on standard error
  local regex=$1; shift
  set +e; "$@" > "$work/out" 2> "$work/err"; local status=$?; set -e
  if [ "$status" != 2 ] || ! grep -Eq "$regex" "$work/err"; then
    echo "expected exit 2 and /$regex/ from: $*"; echo "got $status:"; cat "$work/err"; exit 1
  fi
}

"$strata" run "$strategy" --out "$run" "${small[@]}" > /dev/null
cp "$run/metrics.jsonl" "$work/metrics.first"; cp "$run/strategy.toml" "$work/strategy.first"

# 8: a second run into the same directory without --resume is refused and changes nothing.
fails "already holds a run .*--resume.*--overwrite" "$strata" run "$strategy" --out "$run" "${small[@]}"
cmp "$run/metrics.jsonl" "$work/metrics.first"
fails "give one" "$strata" run "$strategy" --out "$run" --resume --overwrite "${small[@]}"

# 9: a refused resume writes nothing (strategy.toml stays the saved run's).
# It names what changed (issue 62), from the strategy.toml the run wrote.
fails "saved with another model, data or optimizer configuration: model.d_model = [0-9]+ there, 32 here; resume with" \
  "$strata" run "$strategy" --out "$run" --resume "${small[@]}" --set model.d_model=32
cmp "$run/strategy.toml" "$work/strategy.first"

# Paths may change: the data moved elsewhere resumes (its contents, not its name, are the run's);
# a key stated at its default is the key left out.
cp data/kjv.txt "$work/moved.txt"
"$strata" run "$strategy" --out "$run" --resume "${small[@]}" --set "data.path=$work/moved.txt" --set model.dropout=0.0 > "$work/moved.log"
grep -q "resumed from .*step_00000006 at step 6" "$work/moved.log" || { echo "moved data refused"; cat "$work/moved.log"; exit 1; }
cp "$work/strategy.first" "$run/strategy.toml"

# The learning-rate schedule and clipping may change at a resume (they shape no state), said once
# in a note; the new rate is the one the steps use. The optimizer's own keys may not.
cp -r "$run" "$work/lr_run"
"$strata" run "$strategy" --out "$work/lr_run" --resume "${small[@]}" --set job.steps=8 --set optimizer.lr=0.0005 \
  --set optimizer.schedule=constant --set optimizer.grad_clip=0.5 > "$work/lr.log" 2> "$work/lr.err"
grep -q "resumed from .*step_00000006 at step 6" "$work/lr.log" || { echo "a changed schedule was refused"; cat "$work/lr.log" "$work/lr.err"; exit 1; }
grep -q "^strata: note: resuming with optimizer.lr = 5e-04 (0.00[0-9]* before)$" "$work/lr.err" &&
  grep -q "^strata: note: resuming with optimizer.schedule = \"constant\" (\"cosine\" before)$" "$work/lr.err" &&
  grep -q "^strata: note: resuming with optimizer.grad_clip = 0.5 (1.0 before)$" "$work/lr.err" || { echo "no notes of the changed schedule"; cat "$work/lr.err"; exit 1; }
grep -q '"step":8,.*"lr":0.0005' "$work/lr_run/metrics.jsonl" || { echo "step 8 did not use the new rate"; tail -1 "$work/lr_run/metrics.jsonl"; exit 1; }
fails "saved with another model, data or optimizer configuration: optimizer.beta2 = [0-9.]+ there, 0.9 here; resume with" \
  "$strata" run "$strategy" --out "$run" --resume "${small[@]}" --set optimizer.beta2=0.9

# 10: a record cut short (a full disk, a kill) and records past the checkpoint are dropped.
printf '{"step":7,"loss":1.5}\n{"step":8,"lo' >> "$run/metrics.jsonl"
"$strata" run "$strategy" --out "$run" --resume "${small[@]}" --set job.steps=8 > /dev/null
test "$(grep -c . "$run/metrics.jsonl")" = 8
test "$(sed -nE 's/^\{"step":([0-9]+),.*\}$/\1/p' "$run/metrics.jsonl" | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 "

# 13: a damaged shard under a manifest rewritten to match it: resume falls back to the previous
# checkpoint. A staging directory left by a killed save goes at the next save.
shard=$run/checkpoints/step_00000008/rank_00000.safetensors
old=$(sha256sum "$shard" | cut -d' ' -f1)
printf '\xff\xff\xff\xff\xff\xff\xff\x7f' | dd of="$shard" bs=1 conv=notrunc 2>/dev/null
sed -i "s/$old/$(sha256sum "$shard" | cut -d' ' -f1)/" "$run/checkpoints/step_00000008/manifest.json"
mkdir -p "$run/checkpoints/.tmp-step_00000099"
"$strata" run "$strategy" --out "$run" --resume "${small[@]}" --set job.steps=10 > "$work/fallback.log"
grep -q "skipping checkpoint .*step_00000008" "$work/fallback.log"
grep -q "resumed from .*step_00000006 at step 6" "$work/fallback.log"
test ! -e "$run/checkpoints/.tmp-step_00000099"

# 12: one run at a time per directory; the second is refused naming the first's pid.
"$strata" run "$strategy" --out "$work/busy" "${small[@]}" --set job.steps=100000 > /dev/null 2>&1 &
first=$!
for _ in $(seq 100); do [ -s "$work/busy/.strata.lock" ] && break; sleep 0.1; done
fails "in use by another strata run \\(pid $first\\)" "$strata" run "$strategy" --out "$work/busy" --overwrite "${small[@]}"
kill "$first"; wait "$first" || true

# --overwrite replaces a run; a directory holding anything else is never written into.
"$strata" run "$strategy" --out "$run" --overwrite "${small[@]}" --set job.steps=2 > /dev/null
test "$(grep -c . "$run/metrics.jsonl")" = 2
touch "$run/notes.txt"
fails "holds files that are not a strata run's \\(notes.txt\\)" "$strata" run "$strategy" --out "$run" --overwrite "${small[@]}"

# 11: a failed metrics write stops the run at once with a clear message.
mkdir -p "$work/full" && ln -s /dev/full "$work/full/metrics.jsonl"
fails "cannot write .*metrics.jsonl at step 1: No space left on device" \
  "$strata" run "$strategy" --out "$work/full" --resume "${small[@]}"

# 7: a manifest that is a FIFO is not opened (it would block forever): the checkpoint is skipped.
mkdir -p "$work/fifo/checkpoints/step_00000002" && mkfifo "$work/fifo/checkpoints/step_00000002/manifest.json"
fails "no manifest.json \\(as a regular file\\)" timeout 60 "$strata" ckpt info "$work/fifo/checkpoints/step_00000002"
timeout 60 "$strata" run "$strategy" --out "$work/fifo" --resume "${small[@]}" --set job.steps=1 > "$work/fifo.log"
grep -q "skipping checkpoint .*step_00000002: no manifest.json (as a regular file)" "$work/fifo.log"

# 16: under `run -n 2` with standard output in a file, no progress bar (ANSI) reaches it.
"$strata" run -n 2 "$strategy" --out "$work/two" "${small[@]}" --set job.steps=2 > "$work/two.log"
if grep -q $'\033' "$work/two.log"; then echo "ANSI escapes in redirected output"; exit 1; fi
echo "run directory: refused reruns, FIFO manifests skipped, untouched on a refused resume, cut records dropped, damaged checkpoint skipped, one run at a time, full disk reported, no bars in files"
