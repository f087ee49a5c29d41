#!/usr/bin/env bash
# Usage: check-rank-dies.sh MPIEXEC BINARY
# Passes when the job ends within 60 s (the collective timeout is 300 s) and
# mpirun reports failure: a dead rank ends the job instead of leaving the
# others waiting.
set -u
mpiexec=$1 binary=$2
start=$(date +%s)
timeout 120 "$mpiexec" -n 2 --bind-to none --oversubscribe --allow-run-as-root "$binary"
rc=$?
took=$(($(date +%s) - start))
echo "mpirun exited with $rc after ${took} s"
if ((rc == 0)); then echo "FAIL: the job reported success although rank 1 died"; exit 1; fi
if ((rc == 124 || took >= 60)); then echo "FAIL: the job outlived the dead rank by ${took} s"; exit 1; fi
echo "PASS: the job ended ${took} s after rank 1 died"
