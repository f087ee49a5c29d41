#!/usr/bin/env bash
# Usage: check-heartbeat.sh MPIEXEC BINARY RANKS LIMIT_S [WEFT_FLIGHT]
# Runs heartbeat_main.cpp under mpirun with RANKS ranks (WEFT_HEARTBEAT_*
# from the environment). Rank 1 stops itself; passes when every other rank
# names it (rank and host) within LIMIT_S seconds of the stop and the job
# ends (the stopped rank is continued and killed if mpirun leaves it).
# Prints each survivor's time from the stop to its error. With WEFT_FLIGHT
# (scripts/weft-flight), the survivors' flight-recorder dumps must say why
# (the heartbeat) and the analyzer must name rank 1.
set -u
mpiexec=$1 binary=$2 ranks=$3 limit=$4 flight=${5:-}
log=$(mktemp)
dumps=$(mktemp -d)
trap 'rm -rf "$log" "$dumps"' EXIT
export WEFT_FLIGHT_RECORDER_DIR=$dumps
start=$(date +%s)
timeout -k 5 $((limit + 60)) "$mpiexec" -n "$ranks" --bind-to none --oversubscribe --allow-run-as-root "$binary" >"$log" 2>&1 &
job=$!
# The stopped rank is left to mpirun; once every survivor has reported,
# or the time is up, it is continued so that the job can end.
pid=""
for ((i = 0; i < 10 * (limit + 30); ++i)); do
  [[ -z $pid ]] && pid=$(sed -n 's/^rank 1: stopping pid \([0-9]*\) .*/\1/p' "$log")
  (($(grep -c "^rank [0-9]*: \(named rank 1\|WRONG\)" "$log") >= ranks - 1)) && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
sleep 2
if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
  echo "the stopped rank (pid $pid) is still there: continued and killed"
  kill -CONT "$pid" 2>/dev/null
  sleep 1
  kill -KILL "$pid" 2>/dev/null
fi
wait "$job"
rc=$?
took=$(($(date +%s) - start))
cat "$log"
echo "mpirun exited with $rc after ${took} s"
stopped=$(sed -n 's/^rank 1: stopping pid [0-9]* at \([0-9]*\)$/\1/p' "$log")
[[ -z $stopped ]] && { echo "FAIL: rank 1 never stopped"; exit 1; }
fail=0
for ((r = 0; r < ranks; ++r)); do
  ((r == 1)) && continue
  at=$(sed -n "s/^rank $r: named rank 1 at \([0-9]*\) .*/\1/p" "$log")
  if [[ -z $at ]]; then
    echo "FAIL: rank $r did not name rank 1"
    fail=1
    continue
  fi
  ms=$((at - stopped))
  echo "rank $r named rank 1 $ms ms after the stop"
  ((ms > limit * 1000)) && { echo "FAIL: later than ${limit} s"; fail=1; }
done
((rc == 0)) && { echo "FAIL: the job reported success"; fail=1; }
((rc == 124 || rc == 137)) && { echo "FAIL: the job did not end"; fail=1; }
if [[ -n $flight ]]; then
  for ((r = 0; r < ranks; ++r)); do
    ((r == 1)) && continue
    grep -q '"reason": *"heartbeat: ' "$dumps/weft-flight-rank$r.json" 2>/dev/null ||
      { echo "FAIL: rank $r left no flight record of the heartbeat loss"; fail=1; }
  done
  python3 "$flight" "$dumps" >"$log" 2>&1
  cat "$log"
  [[ $(grep "^culprit: " "$log" | cut -d' ' -f2-3 | sort -u) == "rank 1" ]] ||
    { echo "FAIL: weft-flight did not name rank 1 alone"; fail=1; }
fi
((fail)) && exit 1
echo "PASS: every survivor named rank 1, and the job ended after ${took} s"
