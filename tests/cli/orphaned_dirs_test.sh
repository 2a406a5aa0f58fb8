#!/usr/bin/env bash
# orphaned_dirs_test.sh STRATA WORKDIR: a `strata run -n N` killed with SIGKILL cannot remove its
# attempt's temporary directories (/dev/shm/strata-progress-*, /tmp/strata-errors-*); each names
# its supervisor (pid and pid namespace), and the next run removes those whose supervisor is gone.
# Kept: a live supervisor's, one from another pid namespace, one that names none.
set -uo pipefail
strata=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "orphaned_dirs_test: $1" >&2; fail=1; }
tag=$$
dead=$(bash -c 'true & p=$!; wait $p; echo $p')
space=$(readlink /proc/self/ns/pid)
mkdir -p "/dev/shm/strata-progress-dead$tag" "/tmp/strata-errors-dead$tag" "/tmp/strata-errors-live$tag" \
         "/tmp/strata-errors-other$tag" "/dev/shm/strata-progress-unnamed$tag"
echo "$dead $space" > "/dev/shm/strata-progress-dead$tag/supervisor_pid"
echo "$dead $space" > "/tmp/strata-errors-dead$tag/supervisor_pid"
echo "$$ $space" > "/tmp/strata-errors-live$tag/supervisor_pid"
echo "$dead pid:[1]" > "/tmp/strata-errors-other$tag/supervisor_pid"
"$strata" run -n 2 tests/cli/parity.toml --out "$work/run" --set job.steps=2 --set job.checkpoint_at_end=false > "$work/run.log" 2>&1 ||
  check "the run failed: $(tail -3 "$work/run.log")"
[ ! -e "/dev/shm/strata-progress-dead$tag" ] && [ ! -e "/tmp/strata-errors-dead$tag" ] || check "a dead supervisor's directories were kept"
[ -d "/tmp/strata-errors-live$tag" ] || check "a live supervisor's directory was removed"
[ -d "/tmp/strata-errors-other$tag" ] || check "another pid namespace's directory was removed"
[ -d "/dev/shm/strata-progress-unnamed$tag" ] || check "a directory naming no supervisor was removed"
rm -rf "/tmp/strata-errors-live$tag" "/tmp/strata-errors-other$tag" "/dev/shm/strata-progress-unnamed$tag" "$work"
exit $fail
