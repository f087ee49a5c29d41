#!/usr/bin/env python3
"""scripts/weft-run restarts a data-parallel trainer whose rank was killed,
from the run's newest checkpoint, and the run ends where an unbroken one
does.

With --pipeline, TRAINER is weft-pipeline --dist (no reference run or JSON
line: its --check makes the exit status compare the weights). Otherwise two
runs of TRAINER ARGS (which must include --dist and --json, not
--checkpoint): the reference, `mpirun -np N` unbroken; then under weft-run
--np N with --checkpoint DIR, while this script watches DIR/latest and, once
it exists (and --after-step steps are saved), SIGKILLs (--signal STOP:
SIGSTOPs, so that only the survivors' heartbeat can end the job) the rank
--kill-rank process (found among weft-run's descendants by its OMPI_COMM_WORLD_RANK).
Checked: weft-run exits 0, logged one restart naming the killed rank and
"resuming from" DIR's checkpoint, the restarted job printed "resumed from",
ran on --expect-ranks processes, ended with the reference's total steps and
a test accuracy within --tolerance of the reference's. Prints the time from
the kill to the restarted job's first step (the trainer's "first step after
resuming" line).

usage: check_elastic.py --launcher WEFT_RUN --mpirun-args ARGS --np N
                        [--min-ranks M] [--expect-ranks K] [--kill-rank R] [--signal KILL|STOP]
                        [--after-step S] [--tolerance T] [--workdir W]
                        [--keep] TRAINER [ARGS...]
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def fail(msg):
    sys.exit(f"check_elastic: FAIL: {msg}")


def result(stdout, what):
    lines = [l for l in stdout.splitlines() if l.startswith('{"model"')]
    if not lines:
        fail(f"{what} printed no JSON line:\n{stdout[-4000:]}")
    return json.loads(lines[-1])


def descendants(root):
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            out.append(c)
            todo.append(c)
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(item.split(b"=", 1)[1])
    return None


def saved_step(run_dir):
    try:
        target = os.readlink(os.path.join(run_dir, "latest"))
    except OSError:
        return -1
    m = re.search(r"step-(\d+)", target)
    return int(m.group(1)) if m else -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="")
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--min-ranks", type=int)
    ap.add_argument("--expect-ranks", type=int)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--signal", choices=("KILL", "STOP"), default="KILL",
                    help="STOP: the rank stops answering instead; the heartbeat must name it")
    ap.add_argument("--after-step", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-reference", action="store_true", help="skip the unbroken run (its accuracy not compared)")
    ap.add_argument("--pipeline", action="store_true",
                    help="TRAINER is weft-pipeline --dist (no JSON line; give it --check: the restarted job's exit "
                         "status says its weights are the unpipelined model's after every step)")
    ap.add_argument("trainer")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    expect = a.expect_ranks if a.expect_ranks is not None else a.np
    mpirun = [a.mpirun] + shlex.split(a.mpirun_args)
    work = a.workdir or tempfile.mkdtemp(prefix="weft-elastic-")
    os.makedirs(work, exist_ok=True)
    run_dir = os.path.join(work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        ref = None
        if not a.no_reference and not a.pipeline:
            cmd = mpirun + ["-np", str(a.np), a.trainer] + a.args
            t0 = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                fail(f"the reference {' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            ref = result(proc.stdout, "the reference")
            print(f"reference on {a.np} ranks: test acc {ref['test_acc']:.4f}, {ref['total_steps']} steps, "
                  f"{time.time() - t0:.1f} s", flush=True)

        cmd = [sys.executable, a.launcher, "--np", str(a.np), "--mpirun", a.mpirun, "--mpirun-args", a.mpirun_args,
               "--backoff", "0.5"]
        if a.min_ranks is not None:
            cmd += ["--min-ranks", str(a.min_ranks)]
        cmd += ["--", a.trainer] + a.args + ["--checkpoint", run_dir, "--checkpoint-every", str(a.checkpoint_every)]
        print("$ " + shlex.join(cmd), flush=True)
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = [], []
        pumps = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")), daemon=True)
                 for s, b in ((launcher.stdout, out), (launcher.stderr, err))]
        for t in pumps:
            t.start()
        killed_at, victim = None, None
        deadline = time.time() + 900
        while launcher.poll() is None and time.time() < deadline:
            if saved_step(run_dir) >= a.after_step:
                for pid in descendants(launcher.pid):
                    if rank_of(pid) == a.kill_rank:
                        victim = pid
                        break
                if victim:
                    os.kill(victim, signal.SIGSTOP if a.signal == "STOP" else signal.SIGKILL)
                    killed_at = time.time()
                    print(f"{'stopped' if a.signal == 'STOP' else 'killed'} rank {a.kill_rank} (pid {victim}) at {killed_at:.3f}, the run's latest "
                          f"checkpoint at step {saved_step(run_dir)}", flush=True)
                    break
            time.sleep(0.02)
        try:
            rc = launcher.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            launcher.kill()
            fail("weft-run did not end in time")
        for t in pumps:
            t.join(timeout=10)
        stdout, stderr = "".join(out), "".join(err)
        log = [l for l in stderr.splitlines() if l.startswith("weft-run:")]
        print("\n".join(log), flush=True)
        if killed_at is None:
            fail(f"no rank {a.kill_rank} process was found to kill (the run ended first?):\n{stdout[-3000:]}\n{stderr[-3000:]}")
        if rc != 0:
            fail(f"weft-run exited {rc}:\n{stdout[-3000:]}\n{stderr[-3000:]}")
        restarts = [l for l in log if re.search(r"restart \d+ of", l)]
        if len(restarts) != 1:
            fail(f"expected one restart, weft-run logged {len(restarts)}:\n" + "\n".join(log))
        if f"on {expect} ranks" not in restarts[0] or "resuming from" not in restarts[0]:
            fail(f"the restart is not on {expect} ranks from the latest checkpoint: {restarts[0]}")
        failed = [l for l in log if "the job failed" in l]
        if not failed or f"rank {a.kill_rank}" not in failed[0]:
            fail(f"the failure's cause does not name rank {a.kill_rank}: {failed}")
        if "resumed from" not in stdout:
            fail(f"the restarted job did not resume:\n{stdout[-3000:]}")
        if a.pipeline:
            if not re.search(r"resumed from \S+: step [1-9]", stdout):
                fail(f"the restarted pipeline did not say where it resumed:\n{stdout[-3000:]}")
            print("OK: restarted after the killed rank and resumed from the latest checkpoint")
            return
        got = result(stdout, "the restarted run")
        first = re.search(r"first step after resuming done at unix time ([0-9.]+)", stdout)
        if not first:
            fail("the restarted run printed no first step")
        recovery = float(first.group(1)) - killed_at
        print(f"restarted on {got['processes']} ranks from step {got['resumed_at_step']}: test acc "
              f"{got['test_acc']:.4f}, {got['total_steps']} steps; kill to the first step after resuming: "
              f"{recovery:.1f} s", flush=True)
        if got["processes"] != expect:
            fail(f"the restarted run had {got['processes']} processes, expected {expect}")
        if got["resumed_at_step"] <= 0:
            fail("the restarted run started at step 0: it did not resume")
        if ref is not None:
            if got["total_steps"] != ref["total_steps"]:
                fail(f"the restarted run ended at step {got['total_steps']}, the reference at {ref['total_steps']}")
            diff = abs(got["test_acc"] - ref["test_acc"])
            if diff > a.tolerance:
                fail(f"test accuracy {got['test_acc']:.4f} vs the reference's {ref['test_acc']:.4f}: "
                     f"{diff:.4f} apart, more than {a.tolerance}")
            print(f"test accuracy {got['test_acc']:.4f} vs unbroken {ref['test_acc']:.4f} (within {a.tolerance})")
        print("OK: restarted after the killed rank and resumed from the latest checkpoint")
    finally:
        if not a.keep and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
