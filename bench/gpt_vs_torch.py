#!/usr/bin/env python3
"""Same-call comparison of weft-train-gpt and its PyTorch peer.

Runs weft-train-gpt --json and bench/torch_train_peer.py --model gpt with the
same GPT configuration, context, batch size, steps, warm-up, optimizer,
learning rate, precision, corpus and thread count, alternating them
(weft, pytorch, weft, pytorch, ...) for --rounds rounds, so that a change in
the machine's load lands on both. Prints one JSON line per round (both
tokens/s, their ratio pytorch / weft, each run's step time, validation loss,
wall time and the other load on the machine while it ran) and a summary line
with both medians and the ratio of the medians against the target (1.2 on the
CPU: Weft within 1.2x of PyTorch's tokens/s; 1.0 on a GPU: Weft's step no
slower than PyTorch eager's). Threads: PyTorch's intra-op threads
(torch.set_num_threads) and the Weft CPU device's workers (WEFT_CPU_WORKERS).

  python3 bench/gpt_vs_torch.py --gpt tiny --context 128 --batch-size 16 --steps 20 --threads 2
  python3 bench/gpt_vs_torch.py --dry-run            # the two command lines, nothing run
  python3 bench/gpt_vs_torch.py --gpt small --device cuda --precision bf16 --batch-size 8 --steps 30

Exit status: 0 done (whether or not the target holds: see "holds"), 1 a run
failed or printed no summary, 2 bad arguments.
"""
import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def fail(message, status=1):
    print(f"gpt_vs_torch: {message}", file=sys.stderr)
    sys.exit(status)


def python_with_torch(explicit):
    """The interpreter for the peer: --python, else this one if it imports torch, else /usr/bin/python3
    (Debian's python3-torch) if that one does."""
    if explicit:
        return explicit
    candidates = [sys.executable, "/usr/bin/python3"]
    for py in candidates:
        if py and os.path.exists(py) and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    return None


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def busy_cpu_seconds():
    """Every CPU's non-idle time since boot (/proc/stat), in seconds; None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name, cmd, env, verbose):
    """Runs one side; returns its summary (the last JSON line with tokens_per_s) and the machine's load."""
    busy0, child0, load0 = busy_cpu_seconds(), children_cpu_seconds(), os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    busy1, child1 = busy_cpu_seconds(), children_cpu_seconds()
    if verbose:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        fail(f"{name} exited with {proc.returncode}: {shlex.join(cmd)}\n{proc.stderr.strip()[-2000:]}")
    summary = None
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "tokens_per_s" in row and "step" not in row and "eval" not in row:  # not a report line
                summary = row
    if summary is None:
        fail(f"{name} printed no JSON summary with tokens_per_s: {shlex.join(cmd)}\n{proc.stdout.strip()[-2000:]}")
    own = child1 - child0
    # CPUs' worth of other processes' work while this one ran (the builds and tests of others on a shared host).
    other = None if busy0 is None else max(0.0, (busy1 - busy0) - own) / wall
    return summary, {"wall_s": wall, "cpu_s": own, "other_cores": other, "loadavg_1m": load0}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__[__doc__.index("\n\n") + 2:])
    ap.add_argument("--weft", default=os.path.join(ROOT, "build", "examples", "weft-train-gpt"),
                    help="weft-train-gpt (default: build/examples/weft-train-gpt)")
    ap.add_argument("--peer", default=os.path.join(HERE, "torch_train_peer.py"), help="the PyTorch peer script")
    ap.add_argument("--python", default=None,
                    help="interpreter for the peer (default: this one if it imports torch, else /usr/bin/python3)")
    ap.add_argument("--gpt", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--context", type=int, default=0, help="tokens per sequence (default: the config's)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20, help="training steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=0,
                    help="the peer's first steps left out of its timing (default 0: weft-train-gpt's tokens/s "
                         "counts every training step, so 0 keeps the two figures alike)")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="weft-train-gpt's --eval-every (default: --steps, one evaluation at the end, as the peer; "
                         "an evaluation waits for every pushed step)")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default=None,
                    help="default: fp32 on the CPU, tf32 on cuda (the trainers' default)")
    ap.add_argument("--optimizer", choices=["sgd", "momentum", "adam", "adamw"], default="adamw")
    ap.add_argument("--lr", type=float, default=None, help="default: each side's (0.001 for adam and adamw)")
    ap.add_argument("--weight-decay", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", default=None, help="the corpus (default: both sides' $WEFT_TEXT_CORPUS or kjv.txt)")
    ap.add_argument("--eval-batches", type=int, default=None)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu: Weft's cpu:0 and PyTorch's CPU; cuda: gpu:0 and cuda:0")
    ap.add_argument("--threads", type=int, default=0,
                    help="PyTorch's threads and the Weft CPU device's workers (default: the CPUs this process may run on)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", type=float, default=None,
                    help="the ratio pytorch / weft tokens/s to hold (default 1.2 on the CPU, 1.0 on cuda)")
    ap.add_argument("--weft-arg", action="append", default=[], help="one more argument for weft-train-gpt")
    ap.add_argument("--peer-arg", action="append", default=[], help="one more argument for the peer")
    ap.add_argument("--weft-env", action="append", default=[], metavar="NAME=VALUE",
                    help="one more environment variable for weft-train-gpt")
    ap.add_argument("--peer-env", action="append", default=[], metavar="NAME=VALUE",
                    help="one more environment variable for the peer (e.g. OMP_WAIT_POLICY=passive)")
    ap.add_argument("--only", choices=["weft", "pytorch"], default=None,
                    help="run one side alone (its rounds and medians, no ratio)")
    ap.add_argument("--dry-run", action="store_true", help="print the two command lines and stop")
    ap.add_argument("--verbose", action="store_true", help="pass both sides' stderr through")
    args = ap.parse_args()

    if args.context < 0:
        fail(f"--context {args.context} must be positive (0: the config's)", 2)
    if args.eval_every < 0:
        fail(f"--eval-every {args.eval_every} must be positive (0: --steps)", 2)
    for flag in ("batch_size", "steps", "rounds"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be positive", 2)
    if args.warmup < 0 or args.steps <= args.warmup:
        fail(f"--steps {args.steps} must exceed --warmup {args.warmup} (the timed steps follow the warm-up)", 2)
    if args.threads < 0:
        fail(f"--threads {args.threads} must be positive (0: every CPU)", 2)
    threads = args.threads or cpus()
    precision = args.precision or ("tf32" if args.device == "cuda" else "fp32")
    target = args.target if args.target is not None else (1.0 if args.device == "cuda" else 1.2)

    # The flags both sides take under the same name, then each side's own:
    # weft-train-gpt's --model and --data are the peer's --gpt and --text.
    common = (["--context", str(args.context)] if args.context else []) + [
        "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--precision", precision,
        "--optimizer", args.optimizer, "--seed", str(args.seed)]
    if args.lr is not None:
        common += ["--lr", repr(args.lr)]
    if args.weight_decay is not None:
        common += ["--weight-decay", repr(args.weight_decay)]
    if args.eval_batches is not None:
        common += ["--eval-batches", str(args.eval_batches)]
    text = ["--text", args.text] if args.text is not None else []

    weft_cmd = [args.weft, "--model", args.gpt] + common + (["--data", args.text] if args.text is not None else []) + [
        "--eval-every", str(args.eval_every or args.steps),
        "--devices", "gpu:0" if args.device == "cuda" else "cpu:0", "--json"] + args.weft_arg
    def env_of(pairs, flag, base):
        env = dict(base)
        for pair in pairs:
            name, eq, value = pair.partition("=")
            if not eq or not name:
                fail(f"{flag} {pair!r}: want NAME=VALUE", 2)
            env[name] = value
        return env

    weft_env = env_of(args.weft_env, "--weft-env", dict(os.environ, WEFT_CPU_WORKERS=str(threads)))
    python = python_with_torch(args.python)
    peer_cmd = [python or "python3", args.peer, "--model", "gpt", "--gpt", args.gpt] + common + text + [
        "--warmup", str(args.warmup), "--device", args.device, "--threads", str(threads)] + args.peer_arg
    peer_env = env_of(args.peer_env, "--peer-env", os.environ)

    if args.dry_run:
        print("weft:    " + shlex.join([f"WEFT_CPU_WORKERS={threads}"] + args.weft_env + weft_cmd))
        print("pytorch: " + shlex.join(args.peer_env + peer_cmd))
        return 0
    run_weft, run_torch = args.only != "pytorch", args.only != "weft"
    if run_weft and not os.access(args.weft, os.X_OK):
        fail(f"--weft {args.weft}: no such program (build it: ninja -C build weft-train-gpt)", 2)
    if run_torch and python is None:
        fail("no python3 here imports torch (Debian: apt-get install python3-torch; or say --python)", 2)

    rows, last = [], {}
    for r in range(1, args.rounds + 1):
        row = {"round": r, "gpt": args.gpt, "device": args.device, "precision": precision, "threads": threads}
        for side, cmd, env, on in (("weft", weft_cmd, weft_env, run_weft), ("torch", peer_cmd, peer_env, run_torch)):
            if not on:
                continue
            out, machine = run("weft-train-gpt" if side == "weft" else "torch_train_peer.py", cmd, env, args.verbose)
            if out.get("step_ms") is None and out.get("tokens_per_s"):
                # weft-train-gpt reports tokens/s alone: its mean step (it does not wait per step).
                out["step_ms"] = 1e3 * args.batch_size * out.get("context", args.context) / out["tokens_per_s"]
            last[side] = out
            row.update({f"{side}_tokens_per_s": out["tokens_per_s"], f"{side}_step_ms": out.get("step_ms"),
                        f"{side}_val_loss": out.get("val_loss"), f"{side}_wall_s": machine["wall_s"],
                        f"{side}_other_cores": machine["other_cores"], f"{side}_loadavg_1m": machine["loadavg_1m"]})
            if side == "weft" and "core_round_trip_ns" in out:
                row["core_round_trip_ns"] = out["core_round_trip_ns"]
        if run_weft and run_torch:
            row["ratio"] = row["torch_tokens_per_s"] / row["weft_tokens_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)

    summary = {"summary": True, "gpt": args.gpt, "config": last.get("torch", last.get("weft", {})).get("config"),
               "context": args.context or None, "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
               "precision": precision, "optimizer": args.optimizer, "device": args.device, "threads": threads,
               "rounds": args.rounds}
    for side in ("weft", "torch"):
        if side in last:
            summary[f"{side}_tokens_per_s"] = median([r[f"{side}_tokens_per_s"] for r in rows])
            summary[f"{side}_step_ms"] = median([r[f"{side}_step_ms"] for r in rows])
            summary[f"{side}_params"] = last[side].get("params", last[side].get("parameters"))
    if run_weft and run_torch:
        ratio = summary["torch_tokens_per_s"] / summary["weft_tokens_per_s"]
        summary.update({"ratio": ratio, "ratio_median_of_rounds": median([r["ratio"] for r in rows]),
                        "target": target, "holds": ratio <= target,
                        "same_params": summary["weft_params"] == summary["torch_params"]})
        if not summary["same_params"]:
            print(f"gpt_vs_torch: the two models differ: weft has {summary['weft_params']} parameters, "
                  f"pytorch {summary['torch_params']}", file=sys.stderr)
        # What each side says it ran, key by key.
        differ = [k for k in ("steps", "batch_size", "context", "precision", "optimizer", "lr")
                  if last["weft"].get(k) != last["torch"].get(k)]
        summary["same_settings"] = not differ
        for k in differ:
            print(f"gpt_vs_torch: {k} differs: weft ran {last['weft'].get(k)!r}, pytorch {last['torch'].get(k)!r}",
                  file=sys.stderr)
    if "torch" in last:
        summary.update({"torch": last["torch"].get("torch"), "attention": last["torch"].get("attention")})
    summary.update({"other_cores": median([r.get(f"{s}_other_cores") for r in rows for s in ("weft", "torch")]),
                    "cpus": cpus(), "weft": shlex.join(args.weft_env + weft_cmd),
                    "pytorch": shlex.join(args.peer_env + peer_cmd)})
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
