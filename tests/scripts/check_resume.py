#!/usr/bin/env python3
"""A trainer stopped and resumed from its checkpoint must end where an
unbroken run ends. Three runs of TRAINER with ARGS (which must not give
--epochs): the reference, --epochs 2 unbroken; then --epochs 1 --checkpoint
DIR (and --checkpoint-every 3); then --resume FROM --epochs 2 in a new
process, FROM being DIR (its newest checkpoint, the epoch's end) or, with
--mid-epoch, DIR/step-00000003 (three steps into the first epoch). With
--exact the resumed run's weights must equal the reference's bit for bit
(weights_digest), and its loss and accuracies to the last printed digit;
otherwise (another number of ranks or devices, or another shard setting:
the sums run in another order) the test accuracy and training loss must
agree within --tolerance. Each phase may run under its own launcher (e.g.
"mpirun -np 2") and with its own extra trainer arguments.

Also checked: DIR/latest names the newest checkpoint, a directory holding
index.json and safetensors shards; resuming with another --batch-size is
refused with exit status 2 naming it.

usage: check_resume.py [--exact | --tolerance T] [--mid-epoch] [--workdir W]
                       [--launch-save CMD] [--launch-resume CMD] [--launch-reference CMD]
                       [--save-args ARGS] [--resume-args ARGS]
                       TRAINER [ARGS...]
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def run(cmd, expect=0):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != expect:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode} (expected {expect}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def result(cmd):
    proc = run(cmd)
    lines = [l for l in proc.stdout.splitlines() if l.startswith('{"model"')]
    if not lines:
        sys.exit(f"{' '.join(cmd)} printed no JSON line:\n{proc.stdout}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--mid-epoch", action="store_true")
    ap.add_argument("--workdir")
    ap.add_argument("--launch-save", default="")
    ap.add_argument("--launch-resume", default="")
    ap.add_argument("--launch-reference", default="")
    ap.add_argument("--save-args", default="")
    ap.add_argument("--resume-args", default="")
    ap.add_argument("trainer")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    o = ap.parse_args()
    work = o.workdir or tempfile.mkdtemp(prefix="weft-resume-")
    run_dir = os.path.join(work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    base = [o.trainer, *o.args, "--json"]

    ref = result([*shlex.split(o.launch_reference), *base, "--epochs", "2", *shlex.split(o.save_args)])
    first = result([*shlex.split(o.launch_save), *base, "--epochs", "1", "--checkpoint", run_dir,
                    "--checkpoint-every", "3", *shlex.split(o.save_args)])
    latest = os.path.join(run_dir, "latest")
    if not os.path.islink(latest) and not os.path.isdir(latest):
        sys.exit(f"{latest} is missing after --checkpoint")
    newest = os.path.realpath(latest)
    want = f"step-{first['total_steps']:08d}"
    if os.path.basename(newest) != want:
        sys.exit(f"{latest} names {newest}, not the epoch's end {want}")
    files = sorted(os.listdir(newest))
    if "index.json" not in files or not any(f.endswith(".safetensors") for f in files):
        sys.exit(f"{newest} holds {files}: want index.json and safetensors shards")

    source = os.path.join(run_dir, "step-00000003") if o.mid_epoch else run_dir
    resumed = result([*shlex.split(o.launch_resume), *base, "--epochs", "2", "--resume", source,
                      *shlex.split(o.resume_args)])
    if resumed["total_steps"] != ref["total_steps"]:
        sys.exit(f"the resumed run ended at step {resumed['total_steps']}, the unbroken one at {ref['total_steps']}")
    if o.exact:
        for key in ("weights_digest", "train_loss", "test_acc"):
            if resumed[key] != ref[key]:
                sys.exit(f"{key}: {ref[key]} unbroken, {resumed[key]} resumed from {source}")
        print(f"resumed from {source}: the same weights ({ref['weights_digest']}), test acc {ref['test_acc']}")
    else:
        for key in ("test_acc", "train_loss"):
            if abs(resumed[key] - ref[key]) > o.tolerance * max(1.0, abs(ref[key])):
                sys.exit(f"{key}: {ref[key]} unbroken, {resumed[key]} resumed from {source} (tolerance {o.tolerance})")
        print(f"resumed from {source}: test acc {resumed['test_acc']} (unbroken {ref['test_acc']}), train loss "
              f"{resumed['train_loss']} (unbroken {ref['train_loss']})")

    if not o.launch_resume:
        refused = run([*base, "--epochs", "2", "--resume", run_dir, "--batch-size", "17"], expect=2)
        if "--batch-size" not in refused.stderr:
            sys.exit(f"resuming with another batch size: stderr does not name --batch-size: {refused.stderr!r}")
    if not o.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
