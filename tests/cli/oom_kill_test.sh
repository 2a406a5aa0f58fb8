#!/usr/bin/env bash
# oom_kill_test.sh STRATA STRATEGY WORKDIR
# A rank the kernel's out-of-memory killer ends is named so: `strata run -n 2` runs in a memory
# cgroup of its own limited to 1500 MiB (made under this process's; the test is skipped, exit 77,
# where no memory cgroup can be made), with ranks of about 1.1 GB each. The supervisor must say
# which rank the OOM killer ended, the limit and what needs less memory, on its one error line and
# in events.jsonl, without mpirun's report around it.
set -uo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
if [[ -n $v1 && -d /sys/fs/cgroup/memory$v1 ]]; then
  group=/sys/fs/cgroup/memory${v1%/}/strata_oom_test_$$ limit_file=memory.limit_in_bytes
else
  group=/sys/fs/cgroup$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup | sed 's:/$::')/strata_oom_test_$$ limit_file=memory.max
fi
mkdir "$group" 2>/dev/null && echo $((1500 << 20)) > "$group/$limit_file" 2>/dev/null || {
  rmdir "$group" 2>/dev/null; echo "skipped: cannot make a memory cgroup here"; exit 77; }
trap 'rmdir "$group" 2>/dev/null' EXIT
bash -c "echo \$\$ > '$group/cgroup.procs' && exec '$strata' run -n 2 '$strategy' --out '$work/run' --set job.steps=4 \
  --set job.max_restarts=0 --set job.threads=1 --set job.global_batch=4 --set model.n_layer=8 --set model.d_model=768 \
  --set model.n_head=12" > "$work/log" 2>&1
status=$?
[[ $status == 1 ]] || { echo "status $status (1 expected)"; cat "$work/log"; exit 1; }
grep -Eq "^strata: error: rank [01] was killed by the kernel's out-of-memory killer, the ranks needing more memory than their cgroup's limit of 1500 MiB \(signal 9; oom_kill in .* rose by [0-9]+; fsdp, activation checkpointing or a smaller \[job\] micro_batch need less" "$work/log" ||
  { echo "the OOM kill is not named:"; cat "$work/log"; exit 1; }
grep -q '"event":"failure".*"cause":"rank [01] was killed by the kernel.s out-of-memory killer' "$work/run/events.jsonl" ||
  { echo "events.jsonl does not name the OOM kill:"; cat "$work/run/events.jsonl"; exit 1; }
grep -q "mpirun noticed\|Primary job" "$work/log" && { echo "mpirun's report is shown:"; cat "$work/log"; exit 1; }
echo "the OOM killer's kill named: $(grep -o 'rank [01] was killed by the kernel.s out-of-memory killer' "$work/log")"
