#!/usr/bin/env bash
# Usage: check-flight.sh MPIEXEC BINARY ANALYZER SCENARIO RANKS CULPRIT
# Runs weft-test-flight-scenario SCENARIO (flight_scenarios_main.cpp) on
# RANKS ranks with the flight recorder's dumps in a fresh directory, then
# the analyzer (scripts/weft-flight) on them. Passes when the analyzer
# found a divergence (exit 1) and names rank CULPRIT and allreduce 'step' #3.
set -u
mpiexec=$1 binary=$2 analyzer=$3 scenario=$4 ranks=$5 culprit=$6
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
WEFT_FLIGHT_RECORDER_DIR=$dir timeout 90 "$mpiexec" -n "$ranks" --bind-to none --oversubscribe --allow-run-as-root \
  -x WEFT_FLIGHT_RECORDER_DIR "$binary" "$scenario" 2>&1 | tail -n 30
echo "mpirun exited with ${PIPESTATUS[0]} after $(($(date +%s) - start)) s; dumps: $(cd "$dir" && echo *)"
out=$(python3 "$analyzer" "$dir" 2>&1)
rc=$?
echo "$out"
echo "weft-flight exited with $rc"
if ((rc != 1)); then echo "FAIL: the analyzer found no divergence (exit $rc, 1 wanted)"; exit 1; fi
if ! grep -q "^culprit: rank $culprit\b" <<<"$out"; then echo "FAIL: rank $culprit is not named the culprit"; exit 1; fi
if ! grep -q "allreduce 'step'.*#3" <<<"$out"; then echo "FAIL: allreduce 'step' #3 is not named"; exit 1; fi
if [[ $scenario == stall ]] && ! grep -q "'stuck in backward'" <<<"$out"; then
  echo "FAIL: the op rank $culprit waits on ('stuck in backward') is not named"
  exit 1
fi
echo "PASS: weft-flight named rank $culprit and allreduce 'step' #3 ($scenario)"
