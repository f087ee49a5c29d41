#!/usr/bin/env bash
# What the MPI heartbeat costs collectives: weft-bench-allreduce under mpirun
# with the heartbeat off, at its default interval (1 s) and at a short one
# (0.05 s), the settings alternating run by run. Each run's weft_mpi rows
# carry vs_peer, Weft's time over plain MPI_Allreduce's in the same process
# and rep (which the heartbeat does not touch); the summary prints one JSON
# line per size with the median over runs of vs_peer per setting and the
# ratio of each heartbeat setting's to off's, and the median of weft_mpi's
# own time per call per setting (on a loaded machine the MPI peer's time
# moves most: read both).
#
# usage: scripts/bench-heartbeat-cost.sh [--bin PATH] [--ranks N] [--runs N] [--out FILE] [-- BENCH_ARGS...]
#   --bin PATH   weft-bench-allreduce (default build/bench/weft-bench-allreduce)
#   --ranks N    ranks (default 2)
#   --runs N     runs of each setting (default 3)
#   --out FILE   every JSON line, tagged with heartbeat and run (default weft-heartbeat-cost-<date>.jsonl)
#   BENCH_ARGS   default: --members 1 --min-bytes 4 --max-bytes 1048576 --reps 5
set -u -o pipefail
bin=build/bench/weft-bench-allreduce
ranks=2
runs=3
out="weft-heartbeat-cost-$(date +%Y%m%d-%H%M%S).jsonl"
bench_args=(--members 1 --min-bytes 4 --max-bytes 1048576 --reps 5)
while (($#)); do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "no weft-bench-allreduce at $bin" >&2; exit 2; }
: >"$out"
for ((run = 1; run <= runs; ++run)); do
  for hb in off 1 0.05; do
    echo "run $run, WEFT_HEARTBEAT_INTERVAL=$hb" >&2
    WEFT_GPU_BACKEND=${WEFT_GPU_BACKEND:-none} WEFT_HEARTBEAT_INTERVAL=$hb \
      mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" "$bin" --json "${bench_args[@]}" |
      grep '^{' | sed "s/^{/{\"heartbeat\":\"$hb\",\"run\":$run,/" >>"$out" || {
      echo "the bench failed (heartbeat $hb, run $run)" >&2
      exit 1
    }
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by, us = {}, {}
for r in rows:
    if r.get("impl") == "weft_mpi" and "vs_peer" in r:
        by.setdefault((r["bytes"], r["heartbeat"]), []).append(r["vs_peer"])
        us.setdefault((r["bytes"], r["heartbeat"]), []).append(r["time_us"])
for size in sorted({b for b, _ in by}):
    off = statistics.median(by[(size, "off")])
    off_us = statistics.median(us[(size, "off")])
    line = {"summary": "heartbeat_cost", "bytes": size, "runs": len(by[(size, "off")]),
            "vs_peer_off": round(off, 4), "time_us_off": round(off_us, 3)}
    for hb in ("1", "0.05"):
        m = statistics.median(by[(size, hb)])
        t = statistics.median(us[(size, hb)])
        line["vs_peer_" + hb] = round(m, 4)
        line["on_over_off_" + hb] = round(m / off, 4)
        line["time_us_" + hb] = round(t, 3)
    print(json.dumps(line))
PY
