#!/usr/bin/env bash
# Runs a command that must refuse its arguments: exit status 2 and a message
# matching the pattern. usage: expect-usage-error.sh <pattern> <command...>
set -uo pipefail
pattern=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [[ $rc -ne 2 ]]; then
  echo "expected exit status 2, got $rc" >&2
  exit 1
fi
grep -q -- "$pattern" <<< "$out" || { echo "no message matching '$pattern'" >&2; exit 1; }
