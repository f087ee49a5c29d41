#!/usr/bin/env bash
# Usage: scripts/flight-scenarios.sh [ROUNDS] [BUILD_DIR]
# The flight recorder's injected failures (tests/collectives/check-flight.sh)
# ROUNDS times each (default 10): a rank skips a collective (3 ranks), calls
# another kind (3 ranks), stalls in an op (2 ranks), is killed (2 ranks).
# ctest runs each once; this is the long version. Prints a line per run and
# the passes per scenario; exits 1 when any run failed.
set -u
rounds=${1:-10}
build=${2:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
binary=$build/tests/weft-test-flight-scenario
if [[ $rounds == -h || $rounds == --help ]]; then sed -n 2,7p "$0"; exit 0; fi
if [[ ! -x $binary ]]; then echo "flight-scenarios.sh: $binary not built (ninja -C $build weft-test-flight-scenario)" >&2; exit 2; fi
declare -A passed
failed=0
for ((r = 1; r <= rounds; ++r)); do
  for c in "skip 3 1" "kind 3 2" "stall 2 1" "kill 2 1"; do
    set -- $c
    start=$(date +%s.%N)
    if out=$(bash "$here/tests/collectives/check-flight.sh" mpirun "$binary" "$here/scripts/weft-flight" "$@" 2>&1) &&
      grep -q "^PASS" <<<"$out"; then
      passed[$1]=$((${passed[$1]:-0} + 1))
      echo "round $r $1: pass ($(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s)"
    else
      failed=1
      echo "round $r $1: FAIL"
      tail -n 20 <<<"$out"
    fi
  done
done
for s in skip kind stall kill; do echo "$s: ${passed[$s]:-0}/$rounds passed"; done
exit $failed
