#!/usr/bin/env bash
# expect.sh STATUS [REGEX | !REGEX]... -- COMMAND...
# Runs COMMAND and fails unless it exits with STATUS and its output (stdout and stderr together)
# matches every REGEX (extended grep, line by line) and none of the !REGEX.
set -u
want_status=$1
shift
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
output=$("$@" 2>&1)
status=$?
echo "$output"
fail=0
if [ "$status" -ne "$want_status" ]; then
  echo "expect.sh: exit status $status, wanted $want_status" >&2
  fail=1
fi
for p in "${patterns[@]}"; do
  if [ "${p:0:1}" = "!" ]; then
    grep -Eq -- "${p:1}" <<<"$output" && { echo "expect.sh: output matches what it must not: ${p:1}" >&2; fail=1; }
  else
    grep -Eq -- "$p" <<<"$output" || { echo "expect.sh: output does not match: $p" >&2; fail=1; }
  fi
done
exit $fail
