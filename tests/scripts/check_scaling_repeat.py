#!/usr/bin/env python3
"""weft-bench-scaling predicts the same thing twice: BENCH runs the given
sweep (add --json --no-checks) twice; every configuration's line must name
its model, and its step_ms must agree within 1% between the runs (modeled
time is virtual: the host's speed and load do not enter). Then bad input is
exit 2 naming the flag: an unknown --model, GPUs that do not split over
--nodes.

usage: check_scaling_repeat.py BENCH [ARGS...]
"""
import json
import subprocess
import sys


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"{' '.join(cmd)}: no JSON lines\n{proc.stdout}\n{proc.stderr}")
    return lines


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd = sys.argv[1:]
    first, second = run(cmd), run(cmd)
    if len(first) != len(second):
        sys.exit(f"{len(first)} lines, then {len(second)}")
    for a, b in zip(first, second):
        if a.get("model") not in ("resnet50", "resnet18"):
            sys.exit(f"no model in {a}")
        key = (a["model"], a["precision"], a["gpus"], a["bucketed"])
        if key != (b["model"], b["precision"], b["gpus"], b["bucketed"]):
            sys.exit(f"the runs' lines differ in order: {key} against {b}")
        x, y = a["step_ms"], b["step_ms"]
        if not x > 0 or abs(x - y) > 0.01 * x:
            sys.exit(f"{key}: step_ms {x} then {y}: more than 1% apart")
        print(f"{key}: {x:.4f} ms, then {y:.4f} ms")
    for bad, says in ((["--model", "vgg16"], "unknown model 'vgg16'"),
                      (["--gpus", "12", "--nodes", "5"], "12 GPUs do not split evenly over 5 nodes")):
        proc = subprocess.run([cmd[0]] + bad, capture_output=True, text=True, timeout=60)
        if proc.returncode != 2 or says not in proc.stderr:
            sys.exit(f"{bad}: exit {proc.returncode}, stderr {proc.stderr!r}; expected 2 and {says!r}")
        print(f"{' '.join(bad)}: exit 2, {proc.stderr.strip()}")


if __name__ == "__main__":
    main()
