#!/usr/bin/env python3
"""scripts/weft-run without training: its refusals of bad input and its
restart logic against a stand-in mpirun (a script that records each command
line and fails the first starts the way Open MPI reports a killed rank).

usage: check_weft_run.py errors WEFT_RUN TRAINER
       check_weft_run.py standin WEFT_RUN

errors: a command that does not exist, a hostfile with no slots, a missing
hostfile, --min-ranks above --np, no --np without a hostfile, a command
without --checkpoint DIR: each exits 2 naming the thing, nothing started;
ranks that refuse their arguments (TRAINER --epochs 0 under the stand-in
mpirun, which runs the command once and exits with its status) are not
restarted.
standin: a killed rank with --min-ranks restarts on the survivors, and so
does a rank the heartbeat declared dead (the survivors exiting 1); the
hostfile is re-read before a restart (a node removed: fewer ranks);
--resume DIR is added only once DIR/latest exists and replaces a --resume
the command had; --max-restarts bounds the restarts and the exit status is
mpirun's; SIGTERM is forwarded to mpirun and nothing restarts.
"""
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

CHECKS = 0


def check(cond, what, proc=None):
    global CHECKS
    CHECKS += 1
    if not cond:
        extra = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}" if proc is not None else ""
        sys.exit(f"check_weft_run: FAIL: {what}{extra}")


def run(argv, timeout=60, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


# The stand-in mpirun: records its argv (one JSON list per line) in
# $STANDIN_LOG; fails while the count of lines is below $STANDIN_FAILS as
# Open MPI does for a SIGKILLed rank $STANDIN_RANK; with $STANDIN_SLEEP
# sleeps (recording a SIGTERM it gets) instead; with $STANDIN_EXEC runs the
# command (everything after -np N) once and exits with its status; else
# exits 0. With $STANDIN_LATEST it creates that run directory's latest link
# on its first start.
STANDIN = r'''#!/usr/bin/env python3
import json, os, signal, subprocess, sys, time
log = os.environ["STANDIN_LOG"]
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
with open(log) as f:
    starts = len(f.readlines())
if os.environ.get("STANDIN_SLEEP"):
    def term(sig, frame):
        with open(log + ".signal", "w") as f:
            f.write(str(sig))
        sys.exit(143)
    signal.signal(signal.SIGTERM, term)
    print("standin: running", flush=True)
    time.sleep(30)
    sys.exit(0)
if os.environ.get("STANDIN_EXEC"):
    args = sys.argv[1:]
    k = args.index("-np")
    rc = subprocess.call(args[k + 2:])
    if rc:
        print("-" * 20 + "\nPrimary job  terminated normally, but 1 process returned\na non-zero exit code.\n"
              "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
              "the job to be terminated. The first process to do so was:\n\n"
              "  Process name: [[4242,1],0]\n  Exit code:    %d" % rc, file=sys.stderr)
    sys.exit(rc)
latest = os.environ.get("STANDIN_LATEST")
if latest and starts == 1:
    os.makedirs(os.path.join(latest, "step-00000004"), exist_ok=True)
    os.symlink("step-00000004", os.path.join(latest, "latest"))
if starts <= int(os.environ.get("STANDIN_FAILS", "0")) and os.environ.get("STANDIN_HEARTBEAT"):
    # A stopped rank 2, declared dead by the heartbeat; the survivors fail.
    print("weft: heartbeat: rank 2 (host node-b.example) has been silent for 10.2 s: declared dead by the heartbeat "
          "of rank 0 (host node-a.example; WEFT_HEARTBEAT_TIMEOUT 10 s)", file=sys.stderr)
    print("weft-train-lenet: training failed: allreduce on world: rank 2 (host node-b.example) has been silent", file=sys.stderr)
    print("-" * 20 + "\nmpirun detected that one or more processes exited with non-zero status, thus causing\n"
          "the job to be terminated. The first process to do so was:\n\n  Process name: [[4242,1],0]\n"
          "  Exit code:    1", file=sys.stderr)
    sys.exit(1)
if starts <= int(os.environ.get("STANDIN_FAILS", "0")):
    rank = os.environ.get("STANDIN_RANK", "1")
    print("weft-train-lenet: training failed: rank %s's peer hung up" % rank if rank != "1" else "", file=sys.stderr)
    print("-" * 20 + "\nmpirun noticed that process rank %s with PID 4711 on node nodeb exited on signal 9 (Killed).\n"
          % rank + "-" * 20, file=sys.stderr)
    sys.exit(137)
sys.exit(0)
'''


def errors(weft_run, trainer, tmp):
    py = [sys.executable, weft_run]
    ck = ["--checkpoint", os.path.join(tmp, "run")]
    p = run(py + ["--np", "2", "--", "/no/such/trainer", "--dist"] + ck)
    check(p.returncode == 2 and "'/no/such/trainer' is not found" in p.stderr, "a missing command exits 2 naming it", p)
    p = run(py + ["--np", "2", "--", "no-such-trainer-xyz", "--dist"] + ck)
    check(p.returncode == 2 and "'no-such-trainer-xyz' is not found" in p.stderr, "a command not on PATH exits 2", p)
    empty = os.path.join(tmp, "empty-hosts")
    with open(empty, "w") as f:
        f.write("# no hosts\nnodea slots=0\n\n")
    p = run(py + ["--hostfile", empty, "--", trainer, "--dist"] + ck)
    check(p.returncode == 2 and f"the hostfile '{empty}' has no slots" in p.stderr, "a hostfile without slots exits 2", p)
    p = run(py + ["--hostfile", os.path.join(tmp, "absent-hosts"), "--", trainer, "--dist"] + ck)
    check(p.returncode == 2 and "cannot read the hostfile" in p.stderr and "absent-hosts" in p.stderr,
          "a missing hostfile exits 2 naming it", p)
    bad = os.path.join(tmp, "bad-hosts")
    with open(bad, "w") as f:
        f.write("nodea slots=two\n")
    p = run(py + ["--hostfile", bad, "--", trainer, "--dist"] + ck)
    check(p.returncode == 2 and "line 1" in p.stderr and "slots=two" in p.stderr, "a bad slots= exits 2 naming the line", p)
    p = run(py + ["--np", "2", "--min-ranks", "3", "--", trainer, "--dist"] + ck)
    check(p.returncode == 2 and "--min-ranks 3 is more than --np 2" in p.stderr, "--min-ranks > --np exits 2", p)
    p = run(py + ["--", trainer, "--dist"] + ck)
    check(p.returncode == 2 and "--np N is needed" in p.stderr, "no --np and no hostfile exits 2", p)
    p = run(py + ["--np", "2", "--", trainer, "--dist", "--epochs", "1"])
    check(p.returncode == 2 and "needs --checkpoint DIR" in p.stderr, "a command without --checkpoint exits 2", p)
    p = run(py + ["--np", "2", "--", trainer, "--dist", "--checkpoint"])
    check(p.returncode == 2 and "--checkpoint needs a directory" in p.stderr, "--checkpoint without DIR exits 2", p)
    p = run(py + ["--np", "0", "--", trainer] + ck)
    check(p.returncode == 2 and "--np must be at least 1" in p.stderr, "--np 0 exits 2", p)
    p = run(py + ["--np", "2", "--max-restarts", "x", "--", trainer] + ck)
    check(p.returncode == 2 and "--max-restarts wants a whole number" in p.stderr, "a bad --max-restarts exits 2", p)
    p = run(py + ["--np", "2", "--mpirun", "/no/such/mpirun", "--", trainer] + ck)
    check(p.returncode == 2 and "mpirun '/no/such/mpirun' not found" in p.stderr, "a missing mpirun exits 2", p)
    # Ranks refusing their arguments: exit 2 and no restart.
    standin = os.path.join(tmp, "mpirun-standin")
    with open(standin, "w") as f:
        f.write(STANDIN)
    os.chmod(standin, 0o755)
    env = dict(os.environ, STANDIN_LOG=os.path.join(tmp, "exec.log"), STANDIN_EXEC="1")
    p = run(py + ["--np", "1", "--mpirun", standin, "--backoff", "0", "--", trainer, "--epochs", "0"] + ck, env=env)
    starts = open(env["STANDIN_LOG"]).read().splitlines()
    check(p.returncode == 2 and "no restart" in p.stderr and len(starts) == 1,
          "ranks that exit 2 on their arguments are not restarted", p)
    print(f"check_weft_run errors: {CHECKS} checks passed")


def standin(weft_run, tmp):
    py = [sys.executable, weft_run]
    script = os.path.join(tmp, "mpirun-standin")
    with open(script, "w") as f:
        f.write(STANDIN)
    os.chmod(script, 0o755)
    trainer = sys.executable  # any existing program: the stand-in never runs it
    run_dir = os.path.join(tmp, "run")

    def starts(log):
        import json
        return [json.loads(l) for l in open(log)]

    # Elastic: 3 ranks, rank 2 killed -> 2; DIR/latest appears during the first start.
    log = os.path.join(tmp, "a.log")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_FAILS="1", STANDIN_RANK="2", STANDIN_LATEST=run_dir)
    p = run(py + ["--np", "3", "--min-ranks", "2", "--mpirun", script, "--backoff", "0", "--", trainer,
                  "--resume", "old", "--checkpoint", run_dir], env=env)
    s = starts(log)
    check(p.returncode == 0 and len(s) == 2, "one restart, then success", p)
    check(s[0][s[0].index("-np") + 1] == "3" and s[1][s[1].index("-np") + 1] == "2", "restarted on the 2 survivors", p)
    check(s[0][-4:] == ["--resume", "old", "--checkpoint", run_dir], "the first start runs the command as given", p)
    check(s[1][-2:] == ["--resume", run_dir] and "old" not in s[1], "the restart resumes from DIR, replacing --resume", p)
    check("rank 2 on nodeb killed by signal 9 (Killed)" in p.stderr and "lost rank 2" in p.stderr,
          "the cause names the rank, node and signal", p)
    check("resuming from" in p.stderr and "step-00000004" in p.stderr, "the restart names the checkpoint", p)

    # A rank declared dead by the heartbeat (the survivors exit 1): elastic, 4 -> 3.
    log = os.path.join(tmp, "g.log")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_FAILS="1", STANDIN_HEARTBEAT="1")
    p = run(py + ["--np", "4", "--min-ranks", "2", "--mpirun", script, "--backoff", "0", "--", trainer,
                  "--checkpoint", run_dir], env=env)
    s = starts(log)
    check(p.returncode == 0 and len(s) == 2 and s[1][s[1].index("-np") + 1] == "3",
          "a rank the heartbeat declared dead is lost: 4 -> 3 ranks", p)
    check("lost rank 2" in p.stderr and "rank 0 exited 1" in p.stderr and "has been silent" in p.stderr,
          "the cause names the silent rank and the heartbeat's line", p)

    # Not elastic, no latest yet: the same ranks, a fresh start (the command as given).
    log = os.path.join(tmp, "b.log")
    fresh = os.path.join(tmp, "fresh")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_FAILS="1")
    p = run(py + ["--np", "3", "--mpirun", script, "--backoff", "0", "--", trainer, "--checkpoint=" + fresh], env=env)
    s = starts(log)
    check(p.returncode == 0 and len(s) == 2 and s[1][s[1].index("-np") + 1] == "3", "without --min-ranks: the same 3 ranks", p)
    check("--resume" not in s[1] and "a fresh start" in p.stderr, "no latest: a fresh start", p)

    # A hostfile that loses a node before the restart: fewer slots, fewer ranks.
    log = os.path.join(tmp, "c.log")
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
        f.write("nodea slots=2\nnodeb slots=2 max_slots=4  # the second node\n")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_FAILS="1")
    proc = subprocess.Popen(py + ["--hostfile", hosts, "--mpirun", script, "--backoff", "2", "--", trainer,
                                  "--checkpoint", run_dir], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 20
    while (not os.path.exists(log) or len(open(log).readlines()) < 1) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # within the 2 s backoff
    with open(hosts, "w") as f:
        f.write("nodea slots=2\n")
    out, err = proc.communicate(timeout=30)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    s = starts(log)
    check(p.returncode == 0 and len(s) == 2, "the hostfile run restarted once", p)
    check(s[0][s[0].index("-np") + 1] == "4" and s[1][s[1].index("-np") + 1] == "2",
          "4 slots, then 2 after the node left the hostfile", p)
    check("--hostfile" in s[1] and hosts in s[1], "mpirun gets the hostfile", p)

    # Bounded: always failing, two restarts, mpirun's status.
    log = os.path.join(tmp, "d.log")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_FAILS="99")
    p = run(py + ["--np", "2", "--max-restarts", "2", "--mpirun", script, "--backoff", "0", "--", trainer,
                  "--checkpoint", run_dir], env=env)
    check(p.returncode == 137 and len(starts(log)) == 3 and "giving up after 2 restarts" in p.stderr,
          "--max-restarts 2: three starts, then mpirun's exit status", p)

    # Elastic floor: 2 ranks, --min-ranks 2, a rank lost: restarts on 2 (never below M).
    log = os.path.join(tmp, "e.log")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_FAILS="1")
    p = run(py + ["--np", "2", "--min-ranks", "2", "--mpirun", script, "--backoff", "0", "--", trainer,
                  "--checkpoint", run_dir], env=env)
    s = starts(log)
    check(p.returncode == 0 and s[1][s[1].index("-np") + 1] == "2", "never below --min-ranks", p)

    # SIGTERM: forwarded to mpirun, no restart.
    log = os.path.join(tmp, "f.log")
    env = dict(os.environ, STANDIN_LOG=log, STANDIN_SLEEP="1")
    proc = subprocess.Popen(py + ["--np", "2", "--mpirun", script, "--", trainer, "--checkpoint", run_dir], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    check("standin: running" in line, "the stand-in started")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    check(open(log + ".signal").read() == str(int(signal.SIGTERM)), "mpirun got the SIGTERM", p)
    check(p.returncode == 143 and len(starts(log)) == 1 and "no restart" in err, "no restart after SIGTERM", p)
    print(f"check_weft_run standin: {CHECKS} checks passed")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("errors", "standin"):
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory(prefix="weft-run-check-") as tmp:
        if sys.argv[1] == "errors":
            errors(sys.argv[2], sys.argv[3], tmp)
        else:
            standin(sys.argv[2], tmp)


if __name__ == "__main__":
    main()
