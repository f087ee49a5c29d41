#!/usr/bin/env python3
"""Checks scripts/weft-flight on hand-made flight-recorder dumps.

  check_weft_flight.py SCRIPTS

Writes dumps (the format of parallel/src/collectives/flight_recorder.cpp)
into a temporary directory and runs `weft-flight` on them: ranks that agree
(exit 0), calls that differ (the minority blamed), a rank that never entered
a collective, a rank still queued behind an op (that op named), a rank
without a dump, a ring that wrapped; and unusable input: a missing file, a
corrupt one, one that is not a flight record (exit 2, the file named, no
traceback). Exits 1 with one line per mismatch. Standard library only.
"""

import json
import os
import subprocess
import sys
import tempfile


def entry(seq, kind="allreduce", name="grad", dtype="float32", count=1024, root=-1, state="completed", comm=1):
    e = {"record": seq, "comm": comm, "seq": seq, "kind": kind, "name": name, "dtype": dtype, "count": count,
         "peer": -1, "root": root, "state": state, "queued_us": 1000 + seq}
    if state != "queued":
        e["started_us"] = 1001 + seq
    if state in ("completed", "failed"):
        e["ended_us"] = 1002 + seq
    if state == "failed":
        e["error"] = "rank 1 never joined within 2 s"
    return e


def dump(rank, size, entries, pending=(), reason="test"):
    return {"format": "weft-flight-record", "version": 1, "rank": rank, "host": "h", "pid": 100 + rank,
            "reason": reason, "time_us": 5000, "capacity": 2000, "recorded": len(entries),
            "communicators": [{"id": 1, "description": f"MPI communicator of {size} ranks", "across_processes": True,
                               "size": size, "local_ranks": [rank], "timeout_ms": 2000, "engine": 0}],
            "entries": list(entries), "pending_ops": list(pending)}


def write(directory, dumps):
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    for d in dumps:
        with open(os.path.join(directory, f"weft-flight-rank{d['rank']}.json"), "w") as f:
            json.dump(d, f)


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=50)


def main():
    script = os.path.join(sys.argv[1], "weft-flight")
    errors = []

    def expect(what, result, rc, present=(), absent=()):
        out = result.stdout + result.stderr
        if result.returncode != rc:
            errors.append(f"{what}: exit {result.returncode}, {rc} wanted; output:\n{out}")
        for text in present:
            if text not in out:
                errors.append(f"{what}: '{text}' missing from:\n{out}")
        for text in absent:
            if text in out:
                errors.append(f"{what}: '{text}' should not be in:\n{out}")
        if "Traceback" in out:
            errors.append(f"{what}: a traceback:\n{out}")

    with tempfile.TemporaryDirectory() as d:
        ok = [entry(1), entry(2, "broadcast", "w", root=0)]
        write(d, [dump(r, 3, ok) for r in range(3)])
        expect("agree", run(script, d), 0, ["no divergence: the 3 ranks agree"], ["culprit"])

        write(d, [dump(0, 3, ok + [entry(3, state="failed")]), dump(1, 3, ok + [entry(3, state="failed")]),
                  dump(2, 3, ok + [entry(3, "barrier", "grad", dtype=None, count=0, state="failed")])])
        expect("differ", run(script, d), 1,
               ["collective #3: the calls differ", "ranks 0, 1 called allreduce 'grad' float32[1024] #3",
                "culprit: rank 2 (called barrier 'grad' #3"], ["culprit: rank 0", "culprit: rank 1"])

        write(d, [dump(0, 3, ok + [entry(3, state="failed")]), dump(1, 3, ok),
                  dump(2, 3, ok + [entry(3, state="failed")])])
        expect("never entered", run(script, d), 1,
               ["rank 1 never entered allreduce 'grad' float32[1024] #3",
                "culprit: rank 1 (never entered allreduce 'grad' float32[1024] #3; its last collective there is #2)"])

        waiting = {"engine": 0, "id": 9, "name": "allreduce 'grad' #3", "device": "cpu(0)", "state": "waiting",
                   "waits": [{"var": 4, "var_name": "grad", "access": "write", "holder": 7,
                              "holder_name": "slow backward", "holder_state": "running"}]}
        running = {"engine": 0, "id": 7, "name": "slow backward", "device": "cpu(0)", "state": "running",
                   "waits": []}
        write(d, [dump(0, 2, ok + [entry(3, state="started")]),
                  dump(1, 2, ok + [entry(3, state="queued")], pending=[waiting, running])])
        expect("stalled", run(script, d), 1,
               ["rank 1 never started allreduce 'grad' float32[1024] #3 (rank 0 did)",
                "culprit: rank 1 (allreduce 'grad' float32[1024] #3 still queued)",
                "op 'allreduce 'grad' #3' (cpu(0)) waits to write var #4 'grad', held by op 'slow backward' (running)"],
               ["culprit: rank 0"])

        write(d, [dump(0, 2, ok + [entry(3, state="started")], reason="SIGTERM")])
        expect("no dump", run(script, d), 1,
               ["note: rank 1 left no dump", "weft-flight-rank1.json missing", "culprit: rank 1 (left no dump)",
                "allreduce 'grad' float32[1024] #3 did not complete"])

        # Rank 0's ring lost #1: compared from #2 on.
        write(d, [dump(0, 2, ok[1:] + [entry(3)]), dump(1, 2, ok + [entry(3)])])
        expect("wrapped", run(script, d), 0, ["no divergence"])

        write(d, [])
        with open(os.path.join(d, "weft-flight-rank0.json"), "w") as f:
            f.write('{"format": "weft-flight-record", "rank": 0, "entries": [')
        expect("corrupt", run(script, d), 2, ["weft-flight-rank0.json: corrupt, not JSON"])
        with open(os.path.join(d, "weft-flight-rank0.json"), "w") as f:
            json.dump({"traceEvents": []}, f)
        expect("not a record", run(script, d), 2, ["weft-flight-rank0.json: not a Weft flight record"])
        missing = os.path.join(d, "weft-flight-rank7.json")
        expect("missing file", run(script, missing), 2, [f"{missing}: no such file"])
        os.remove(os.path.join(d, "weft-flight-rank0.json"))
        expect("empty directory", run(script, d), 2, ["no weft-flight-rank<R>.json in it"])

    for e in errors:
        print(e)
    print(f"{'FAIL' if errors else 'PASS'}: weft-flight checks ({len(errors)} mismatch(es))")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
