#!/usr/bin/env python3
"""A training tool under --sim-model: COMMAND (given --json) exits 0 and each
of its JSON lines carries a prediction: sim_model, a positive
predicted_step_ms, comm_overlap in [0, 1], the utilization of at least one
GPU stream per simulated GPU in use (each in [0, 1]), the cost model's
counts, and no value read back (no loss, accuracy or weights digest). With
--repeat, COMMAND runs again and every line's predicted_step_ms must be
within 3% of the first run's (modeled time is virtual and the engine's GPU
pools take frontend-pushed ops in push order under the mode: neither the
host's speed nor its threads' interleaving enters). With --exit N, COMMAND must instead exit N with each
--stderr TEXT in its error output.

usage: check_sim_model.py [--lines N] [--key KEY=VALUE]... [--repeat] -- COMMAND...
       check_sim_model.py --exit N --stderr TEXT [--stderr TEXT]... -- COMMAND...
"""
import argparse
import json
import subprocess
import sys

READ_BACK = ("train_loss", "train_acc", "test_acc", "loss", "weights_digest", "loss_scale")


def fail(message, proc):
    sys.exit(f"{message}\n--- stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}")


def check_line(line, keys, proc):
    sim = line.get("sim_model")
    if not isinstance(sim, str) or not sim:
        fail(f"no sim_model in {line}", proc)
    step = line.get("predicted_step_ms")
    if not isinstance(step, (int, float)) or not step > 0:
        fail(f"predicted_step_ms {step!r} is not positive", proc)
    v = line.get("comm_overlap")
    if not isinstance(v, (int, float)) or not 0 <= v <= 1:
        fail(f"comm_overlap {v!r} is not in [0, 1]", proc)
    util = line.get("utilization")
    if not isinstance(util, dict) or not util:
        fail(f"utilization {util!r} is not a non-empty object", proc)
    for resource, v in util.items():
        if not resource.startswith("gpu(") or not 0 <= v <= 1:
            fail(f"utilization of {resource!r}: {v!r}", proc)
    gpus = {r.split(")")[0] + ")" for r in util}
    if len(gpus) < line.get("replicas", line.get("stages", 1)):
        fail(f"utilization covers {sorted(gpus)}, fewer GPUs than the line uses", proc)
    if not line.get("kernels_modeled", 0) > 0 or "table_hits" not in line or "fallbacks" not in line:
        fail("kernels_modeled, table_hits or fallbacks missing (or no kernel modeled)", proc)
    for key in READ_BACK:
        if line.get(key) is not None:
            fail(f"{key} = {line[key]!r}: a value read back from modeled kernels", proc)
    for key, want in keys:
        got = line.get(key)
        if str(got) != want:
            fail(f"{key} = {got!r}, expected {want}", proc)


def main():
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("--lines", type=int, default=1, help="JSON lines expected (at least)")
    parser.add_argument("--key", action="append", default=[], help="KEY=VALUE every line must have")
    parser.add_argument("--exit", type=int, help="the exit status expected instead of a prediction")
    parser.add_argument("--stderr", action="append", default=[], help="text the error output must hold")
    parser.add_argument("--repeat", action="store_true", help="run again: the same predictions within 3%%")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if args.exit is not None:
        if proc.returncode != args.exit:
            fail(f"exit status {proc.returncode}, expected {args.exit}", proc)
        for text in args.stderr:
            if text not in proc.stderr:
                fail(f"the error output lacks {text!r}", proc)
        print(f"exit {proc.returncode}: {proc.stderr.strip()}")
        return
    if proc.returncode != 0:
        fail(f"exit status {proc.returncode}", proc)
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    if len(lines) < args.lines:
        fail(f"{len(lines)} JSON line(s), expected at least {args.lines}", proc)
    keys = [tuple(k.split("=", 1)) for k in args.key]
    for line in lines:
        check_line(line, keys, proc)
    for line in lines:
        print(f"predicted step {line['predicted_step_ms']:.3f} ms, comm overlap {line['comm_overlap']:.2f}, "
              f"{line['kernels_modeled']} kernels modeled")
    if args.repeat:
        again = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if again.returncode != 0:
            fail(f"the second run: exit status {again.returncode}", again)
        second = [json.loads(l) for l in again.stdout.splitlines() if l.startswith("{")]
        if len(second) != len(lines):
            fail(f"the second run printed {len(second)} JSON line(s), the first {len(lines)}", again)
        for a, b in zip(lines, second):
            x, y = a["predicted_step_ms"], b["predicted_step_ms"]
            if abs(x - y) > 0.03 * x:
                fail(f"predicted_step_ms {x} then {y}: more than 3% apart", again)
            print(f"again: predicted step {y:.3f} ms")


if __name__ == "__main__":
    main()
