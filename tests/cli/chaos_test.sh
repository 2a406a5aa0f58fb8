#!/usr/bin/env bash
# chaos_test.sh STRATA STRATEGY WORKDIR RANKS TRIALS KIND [EXTRA --set ...]
# Trains 12 steps uninterrupted; then TRIALS times strikes a random rank at a random step under
# the supervisor ([job] max_restarts 2), through STRATA_FAULT: KIND "kill" sends it SIGKILL,
# "stop" SIGSTOP (a hang, which the supervisor must detect within [job] hang_timeout = 3 s and
# blame on that rank, naming the collective the others wait in, with a flight record). Each run
# must finish by itself, record the failure and the restart in events.jsonl, and end with every
# step's metrics (all but timings and peak memory) equal to the uninterrupted run's, bit for bit.
set -euo pipefail
strata=$1 strategy=$2 work=$3 ranks=$4 trials=$5 kind=$6
shift 6
rm -rf "$work" && mkdir -p "$work"
small=(--set job.steps=12 --set job.checkpoint_every=3 --set job.eval_every=6 --set job.log_every=4
       --set job.global_batch=4 --set job.micro_batch=2 --set job.threads=1 --set job.max_restarts=2 --set job.restart_backoff=0.1 --set job.hang_timeout=3
       --set model.n_layer=1 --set model.seq_len=32 --set model.dropout=0.1 "$@")
"$strata" run -n "$ranks" "$strategy" --out "$work/full" "${small[@]}" > "$work/full.log"
metrics() { sed -E 's/"[a-z_]*_ms":[^,}]*,?//g; s/"mem_(device_)?peak_bytes":[^,}]*,?//g' "$1"; }
RANDOM=${CHAOS_SEED:-7}
for trial in $(seq 1 "$trials"); do
  rank=$((RANDOM % ranks)) step=$((RANDOM % 11 + 2))
  out="$work/trial_$trial"
  STRATA_FAULT="$kind $rank $step" "$strata" run -n "$ranks" "$strategy" --out "$out" "${small[@]}" > "$out.log" 2>&1 ||
    { echo "trial $trial (rank $rank, $kind at step $step) did not finish:"; cat "$out.log"; exit 1; }
  if [[ $kind == kill ]]; then expected="\"cause\":\"rank $rank exited on signal 9"
  # A hang names the collective the others wait in (from the flight records) and the stopped rank.
  else expected="\"cause\":\"hang: no rank made progress for [0-9.]* s (deadline 3 s); rank $rank has not issued [a-z_]* #[0-9]* of group [^;]*, which ranks* [0-9, ]* waits* in; rank $rank is at step $step"; fi
  grep -q "\"event\":\"failure\".*$expected" "$out/events.jsonl" ||
    { echo "trial $trial: events.jsonl does not blame rank $rank ($kind at step $step):"; cat "$out/events.jsonl"; exit 1; }
  if [[ $kind == stop ]]; then
    grep -q '"event":"hang".*"flight_record":"flight_record_attempt_0.json"' "$out/events.jsonl" && [[ -s $out/flight_record_attempt_0.json ]] ||
      { echo "trial $trial: no flight record after the hang"; cat "$out/events.jsonl"; exit 1; }
  fi
  grep -q '"event":"finish".*"restarts":1' "$out/events.jsonl" || { echo "trial $trial: no finish after 1 restart"; cat "$out/events.jsonl"; exit 1; }
  diff <(metrics "$work/full/metrics.jsonl") <(metrics "$out/metrics.jsonl") > "$out.diff" ||
    { echo "trial $trial (rank $rank, $kind at step $step): metrics differ from the uninterrupted run:"; head "$out.diff"; exit 1; }
  echo "trial $trial: rank $rank (${kind}) at step $step; finished by itself, metrics bit-identical; $(grep -o '"goodput":[0-9.e-]*' "$out/events.jsonl")"
done
