#!/usr/bin/env python3
"""A trainer killed with SIGKILL at random moments and restarted each time
with --resume must end with bitwise the weights and optimizer state of an
uninterrupted run, and no checkpoint may ever be refused or half-loaded.

TRAINER runs with ARGS (which must not give --epochs, --checkpoint or
--resume) under LAUNCH (e.g. "mpirun -np 2"; none: one process), --epochs E
and --checkpoint RUN --checkpoint-every N. First the reference, unbroken,
into its own run directory. Then campaigns: a fresh run directory, the
trainer started (with --resume RUN once RUN/latest exists) and killed at a
random moment, again and again, until one start runs to its end; its JSON
line's weights_digest, optimizer_digest and total_steps must equal the
reference's. Campaigns repeat until --kills kills were made.

A kill is SIGKILL to every process of the trainer's session (every rank and
the launcher), or, with --rank-kills and a launcher, to one rank only (the
launcher then takes the job down). Half the kills come at a uniformly random
moment of the start-up and the reference's training still ahead; the other half as soon as a save is seen
in flight (a "*.partial" directory in RUN) after a random moment of it, plus
0-1 ms, to land inside the writes. A start resumed from the last step's
checkpoint (it only reports) is not killed. After every kill RUN/latest, when it exists, must name a complete
checkpoint: index.json and every shard it names, each carrying the index's
save identity (weft.save_id). A restart that exits with an error (a refused
checkpoint: status 2) fails the check.

The random generator's state is --seed: the same seed, the same kill plan.

usage: check_chaos.py [--kills K] [--seed S] [--every N] [--epochs E]
                      [--launch CMD] [--rank-kills] [--workdir W] TRAINER [ARGS...]
"""
import argparse
import json
import os
import random
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time


def json_line(text):
    lines = [l for l in text.splitlines() if l.startswith('{"model"')]
    return json.loads(lines[-1]) if lines else None


def safetensors_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return header.get("__metadata__", {})


def check_latest(run_dir):
    """RUN/latest names a complete checkpoint (or does not exist yet)."""
    link = os.path.join(run_dir, "latest")
    if not os.path.lexists(link):
        return None
    target = os.path.realpath(link)
    if not os.path.isdir(target):
        sys.exit(f"{link} names {target}, which is missing")
    if target.endswith(".partial"):
        sys.exit(f"{link} names a partial directory {target}")
    try:
        with open(os.path.join(target, "index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{link} names {target} without a whole index.json: {e}")
    ranks = index["ranks"]
    for r in range(ranks):
        shard = os.path.join(target, f"rank-{r:05d}-of-{ranks:05d}.safetensors")
        if not os.path.isfile(shard):
            sys.exit(f"{link} names {target}, whose shard {shard} is missing")
        got = safetensors_metadata(shard).get("weft.save_id")
        if got != index.get("save_id"):
            sys.exit(f"{link} names {target}: shard {shard} is of save {got}, the index of {index.get('save_id')}")
    return target


def leftovers(run_dir):
    """What an interrupted save leaves, each with its inode and time: a kill
    counts as mid-write when it left something new."""
    out = set()
    if not os.path.isdir(run_dir):
        return out
    for n in os.listdir(run_dir):
        if n.endswith((".partial", ".tmp", ".replaced")) or n.startswith(".latest.tmp"):
            try:
                st = os.lstat(os.path.join(run_dir, n))
                out.add((n, st.st_ino, st.st_mtime_ns))
            except OSError:
                pass
    return out


def in_flight(run_dir):
    try:
        return any(n.endswith(".partial") for n in os.listdir(run_dir))
    except OSError:
        return False


def job_pids(sid, trainer=None):
    """The processes of the job started as session `sid` (a launcher puts
    its ranks in process groups of their own, but in its session); with
    `trainer`, its ranks only."""
    exe = os.path.realpath(trainer) if trainer else None
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if os.getsid(int(p)) == sid and (exe is None or os.path.realpath(f"/proc/{p}/exe") == exe):
                pids.append(int(p))
        except OSError:
            pass
    return sorted(pids)


def kill_job(sid):
    for pid in job_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--launch", default="")
    ap.add_argument("--rank-kills", action="store_true")
    ap.add_argument("--workdir")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one start may take")
    ap.add_argument("trainer")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    o = ap.parse_args()
    rng = random.Random(o.seed)
    work = o.workdir or tempfile.mkdtemp(prefix="weft-chaos-")
    os.makedirs(work, exist_ok=True)
    launch = shlex.split(o.launch)

    def command(run_dir, resume):
        cmd = [*launch, o.trainer, *o.args, "--json", "--epochs", str(o.epochs), "--checkpoint", run_dir,
               "--checkpoint-every", str(o.every)]
        if resume:
            cmd += ["--resume", run_dir]
        return cmd

    ref_dir = os.path.join(work, "reference")
    shutil.rmtree(ref_dir, ignore_errors=True)
    t0 = time.monotonic()
    ref = subprocess.run(command(ref_dir, False), capture_output=True, text=True, timeout=o.timeout)
    duration = time.monotonic() - t0
    ref_json = json_line(ref.stdout)
    if ref.returncode != 0 or not ref_json:
        sys.exit(f"the reference run failed ({ref.returncode}):\n{ref.stdout}\n{ref.stderr}")
    want = {k: ref_json[k] for k in ("weights_digest", "optimizer_digest", "total_steps")}
    train_time = min(duration, ref_json["sec_per_epoch"] * o.epochs)
    startup = duration - train_time
    print(f"reference: {want}, {duration:.2f} s ({train_time:.2f} s training)", flush=True)

    kills = mid_write = rank_only = campaigns = restarts = 0
    while kills < o.kills:
        campaigns += 1
        run_dir = os.path.join(work, f"chaos-{campaigns}")
        shutil.rmtree(run_dir, ignore_errors=True)
        while True:
            resume = os.path.lexists(os.path.join(run_dir, "latest"))
            left_before = leftovers(run_dir)
            restarts += resume
            start = time.monotonic()
            proc = subprocess.Popen(command(run_dir, resume), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
            killed = False
            pids = []
            # A start resumed at the end only reports: it is left to finish.
            at_end = resume and os.path.basename(os.path.realpath(os.path.join(run_dir, "latest"))) == \
                f"step-{want['total_steps']:08d}"
            if kills < o.kills and not at_end:
                on_write = rng.random() < 0.5
                # A resumed start has less to train: moments within its
                # start-up and the part of the reference's training still
                # ahead.
                done = 0.0
                if resume:
                    name = os.path.basename(os.path.realpath(os.path.join(run_dir, "latest")))
                    if name.startswith("step-") and name[5:].isdigit():
                        done = int(name[5:]) / want["total_steps"]
                ahead = (1.0 - done) * train_time
                # On a write: the first save seen in flight after a random
                # moment of the training (else a fifth of the span later).
                watch_from = start + 0.8 * startup + rng.uniform(0.0, 1.0) * ahead
                deadline = (watch_from + 0.2 * (startup + ahead) if on_write
                            else start + rng.uniform(0.0, 1.0) * (startup + ahead))
                delay = rng.uniform(0, 0.001)
                one_rank = o.rank_kills and launch and rng.random() < 0.5
                while proc.poll() is None:
                    now = time.monotonic()
                    if (on_write and now >= watch_from and in_flight(run_dir)) or now >= deadline:
                        time.sleep(delay if on_write and now < deadline else 0)
                        if proc.poll() is not None:
                            break
                        pids = job_pids(proc.pid, o.trainer) if one_rank else []
                        if pids:
                            os.kill(rng.choice(pids), signal.SIGKILL)
                            rank_only += 1
                            try:
                                proc.wait(timeout=30)
                            except subprocess.TimeoutExpired:
                                pass
                        kill_job(proc.pid)
                        killed = True
                        break
                    time.sleep(0.0005)
            out, err = proc.communicate(timeout=o.timeout)
            elapsed = time.monotonic() - start
            # Nothing of the job may outlive it.
            for _ in range(200):
                if not job_pids(proc.pid):
                    break
                kill_job(proc.pid)
                time.sleep(0.05)
            else:
                sys.exit(f"the job of session {proc.pid} outlived its kill: {job_pids(proc.pid)}")
            if killed:
                kills += 1
                new = leftovers(run_dir) - left_before
                mid_write += bool(new)
                latest = check_latest(run_dir)
                print(f"kill {kills} ({'on a save' if on_write else 'at a random moment'}"
                      f"{', one rank' if pids else ''}): {'mid-write, ' if new else ''}latest "
                      f"{os.path.basename(latest) if latest else '(none yet)'}", flush=True)
                continue
            if proc.returncode != 0:
                sys.exit(f"a {'resumed ' if resume else ''}start exited {proc.returncode} (not killed):\n{out}\n{err}")
            got_json = json_line(out)
            if not got_json:
                sys.exit(f"the last start printed no JSON line:\n{out}\n{err}")
            got = {k: got_json[k] for k in want}
            if got != want:
                sys.exit(f"campaign {campaigns}: {got} after the kills, {want} unbroken")
            check_latest(run_dir)
            if not resume and elapsed < duration:
                # An unbroken start that ran faster than the reference (which
                # may have met a busier machine): its times plan the kills.
                startup, train_time = startup * elapsed / duration, train_time * elapsed / duration
                duration = elapsed
            print(f"campaign {campaigns}: ends with the unbroken run's weights and optimizer state {got}", flush=True)
            break
    print(f"chaos: {kills} kills ({mid_write} mid-write, {rank_only} of one rank), {restarts} resumes, "
          f"{campaigns} campaigns: every one ended bitwise as the unbroken run", flush=True)
    if not o.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
