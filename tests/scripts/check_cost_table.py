#!/usr/bin/env python3
"""A cost table made from a trace is what the modeled mode looks up.

Trains LENET (weft-train-lenet) on one simulated GPU with --trace, makes a
cost table of the trace with scripts/cost-table-from-trace, then runs the
same steps under --sim-model TABLE: every kernel of a training step must be
found in the table (only the initializers, pushed before the traced steps,
may fall back to the profile), so the keys the trace carries are the keys
the mode looks up.

usage: check_cost_table.py LENET SCRIPTS_DIR WORK_DIR
"""
import json
import os
import re
import subprocess
import sys


def run(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def main():
    lenet, scripts, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    trace, table = os.path.join(work, "trace.json"), os.path.join(work, "table.txt")
    env = dict(os.environ, WEFT_GPU_BACKEND="sim", WEFT_SIM_GPUS="1")
    run([lenet, "--devices", "gpu:0", "--limit", "128", "--batch-size", "64", "--epochs", "1", "--trace", trace], env)
    run([sys.executable, os.path.join(scripts, "cost-table-from-trace"), trace, "-o", table], env)
    entries = [l for l in open(table, encoding="utf-8") if l.strip() and not l.startswith(("#", "weft-cost-table", "profile"))]
    ops = {l.rsplit(" ", 2)[0] for l in entries}
    for want in ("conv2d", "conv2d_backward_filter", "dense", "dense_backward"):
        if not any(o == want or o.startswith(want + " ") for o in ops):
            sys.exit(f"{table}: no entry for {want} (ops: {sorted(ops)})")
    proc = run([lenet, "--sim-model", table, "--limit", "128", "--batch-size", "64", "--steps", "1", "--json"], env)
    line = json.loads([l for l in proc.stdout.splitlines() if l.startswith("{")][-1])
    hits, kernels = line.get("table_hits", 0), line.get("kernels_modeled", 0)
    missing = [m for m in proc.stdout.splitlines() + proc.stderr.splitlines() if "fell back" in m]
    if hits == 0:
        sys.exit(f"no kernel found in the table: {line}")
    if line.get("fallbacks", 0) > 0 and not missing:
        sys.exit(f"{line.get('fallbacks')} kernels fell back, but the report does not list them")
    for m in missing:
        listed = re.search(r"fell back to the profile \S+ \((.*)\)\s*$", m)
        if not listed:
            sys.exit(f"unreadable report line: {m}")
        for item in listed.group(1).split("; "):
            op = item.split(" ", 1)[0]
            if item and op not in ("full", "uniform", "normal"):
                sys.exit(f"a training step's kernel fell back to the profile: {item}\n{m}")
    print(f"cost table: {len(entries)} entries; {hits} of {kernels} kernels from the table")


if __name__ == "__main__":
    main()
