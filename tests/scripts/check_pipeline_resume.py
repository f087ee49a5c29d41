#!/usr/bin/env python3
"""weft-pipeline --dist resumes from its checkpoint: a job of a warm-up and
3 steps saves (--checkpoint DIR --checkpoint-every 2: step-00000002 and
step-00000004, DIR/latest the second, one shard per stage); a new job with
--steps 6 --resume DIR runs steps 4 to 6 only and, with --check, ends with
the weights of the unpipelined model trained all 7 steps (the momentum
buffers restored: without them it would not). Also: resuming on another grid
(3 ranks) or with another optimizer exits 2 naming the setting; --checkpoint
without --dist is refused; on 2 stages x 2 replicas (4 ranks) replica 0 of
each stage writes its shard and the resumed job passes --check.

usage: check_pipeline_resume.py MPIRUN_PREFIX PIPELINE   (MPIRUN_PREFIX: e.g.
       "mpirun --oversubscribe -np", the rank count is appended)
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile


def run(cmd, expect):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        sys.exit(f"check_pipeline_resume: FAIL: {shlex.join(cmd)} exited {p.returncode} (expected {expect}):\n"
                 f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    mpirun, pipeline = shlex.split(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="weft-pipeline-resume-") as tmp:
        run_dir = os.path.join(tmp, "run")
        common = [pipeline, "--dist", "--batch-size", "32", "--optimizer", "momentum"]
        run(mpirun + ["2"] + common + ["--steps", "3", "--checkpoint", run_dir, "--checkpoint-every", "2"], 0)
        latest = os.readlink(os.path.join(run_dir, "latest"))
        shards = sorted(os.listdir(os.path.join(run_dir, latest)))
        if latest != "step-00000004" or shards != ["index.json", "rank-00000-of-00002.safetensors",
                                                   "rank-00001-of-00002.safetensors"]:
            sys.exit(f"check_pipeline_resume: FAIL: latest -> {latest} holding {shards}")
        if not os.path.isdir(os.path.join(run_dir, "step-00000002")):
            sys.exit("check_pipeline_resume: FAIL: no step-00000002 (--checkpoint-every 2)")
        p = run(mpirun + ["2"] + common + ["--steps", "6", "--resume", run_dir, "--check"], 0)
        if not re.search(r"resumed from \S+step-00000004: step 4 of 7", p.stdout):
            sys.exit(f"check_pipeline_resume: FAIL: no 'resumed from ... step 4 of 7':\n{p.stdout}")
        steps = re.findall(r"step (\d+)  loss", p.stdout)
        if steps != ["4", "5", "6"]:
            sys.exit(f"check_pipeline_resume: FAIL: the resumed job ran steps {steps}, not 4 5 6")
        if "largest difference from one device" not in p.stdout:
            sys.exit(f"check_pipeline_resume: FAIL: no --check figure:\n{p.stdout}")
        p = run(mpirun + ["3"] + common + ["--steps", "6", "--resume", run_dir], 2)
        if "weft.stages 2, this run has 3" not in p.stderr:
            sys.exit(f"check_pipeline_resume: FAIL: another grid not refused by name:\n{p.stderr}")
        p = run(mpirun + ["2"] + [pipeline, "--dist", "--batch-size", "32", "--steps", "6", "--resume", run_dir], 2)
        if "weft.optimizer" not in p.stderr:
            sys.exit(f"check_pipeline_resume: FAIL: another optimizer not refused by name:\n{p.stderr}")
        p = run([pipeline, "--checkpoint", run_dir], 2)
        if "go with --dist" not in p.stderr:
            sys.exit(f"check_pipeline_resume: FAIL: --checkpoint without --dist not refused:\n{p.stderr}")
        # Pipeline x data parallel (2 stages x 2 replicas): replica 0 of each
        # stage writes its stage's shard; every replica loads it.
        grid = os.path.join(tmp, "grid")
        common = [pipeline, "--dist", "--stages", "2", "--replicas", "2", "--batch-size", "16", "--optimizer", "momentum"]
        run(mpirun + ["4"] + common + ["--steps", "1", "--checkpoint", grid], 0)
        shards = sorted(os.listdir(os.path.join(grid, "latest")))
        if shards != ["index.json", "rank-00000-of-00002.safetensors", "rank-00001-of-00002.safetensors"]:
            sys.exit(f"check_pipeline_resume: FAIL: 2 x 2 grid saved {shards}, not one shard per stage")
        p = run(mpirun + ["4"] + common + ["--steps", "3", "--resume", grid, "--check"], 0)
        if "step 2 of 4" not in p.stdout or "largest difference from one device" not in p.stdout:
            sys.exit(f"check_pipeline_resume: FAIL: the 2 x 2 grid did not resume at step 2 with --check:\n{p.stdout}")
        print("check_pipeline_resume: resumed at step 4 with the unpipelined model's weights; other grids refused")


if __name__ == "__main__":
    main()
