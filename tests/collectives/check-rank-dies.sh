#!/usr/bin/env bash
# Usage: check-rank-dies.sh MPIEXEC BINARY [stalled]
# Passes when the job ends within 60 s (the collective timeout is 300 s) and
# mpirun reports failure: a dead rank ends the job instead of leaving the
# others waiting. With "stalled" (rank 1 alive but never joining a large
# allreduce, fingerprints off, timeout 3 s), rank 0 must also have printed
# the timeout naming the collective.
set -u
mpiexec=$1 binary=$2 mode=${3:-}
start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
args=()
[[ -n $mode ]] && args=("$mode")
timeout 120 "$mpiexec" -n 2 --bind-to none --oversubscribe --allow-run-as-root "$binary" "${args[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
took=$(($(date +%s) - start))
echo "mpirun exited with $rc after ${took} s"
if ((rc == 0)); then echo "FAIL: the job reported success although rank 1 failed"; exit 1; fi
if ((rc == 124 || took >= 60)); then echo "FAIL: the job outlived the failed rank by ${took} s"; exit 1; fi
if [[ $mode == stalled ]] && ! grep -q "rank 0: allreduce 'never completes'.*did not complete within 3 s" "$log"; then
  echo "FAIL: rank 0 did not report the timeout of 'never completes'"
  exit 1
fi
echo "PASS: the job ended ${took} s after rank 1 failed"
