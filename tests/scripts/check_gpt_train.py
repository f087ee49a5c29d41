#!/usr/bin/env python3
"""weft-train-gpt on a small text this script writes (about 20 KB of
sentences drawn by Python's random.Random(0) from a fixed vocabulary, the
same on every run). Modes:

  run TRAINER [ARGS...]     trains with ARGS --data TEXT --json; the summary
                            line must hold a finite val_loss and train_loss,
                            a positive tokens_per_s, the steps asked for
                            (--steps; with --minutes fewer, minutes_reached),
                            and one evaluation line per report;
                            --expect KEY=VALUE (repeatable) checks summary keys
  resume TRAINER [ARGS...]  --steps 6 unbroken against --steps 3
                            --checkpoint DIR then --resume DIR --steps 6 in a
                            new process: the same weights_digest and
                            val_loss, bit for bit; resuming with another
                            --context is refused naming it
  same TRAINER [ARGS...]    --hybridize (a captured step replayed), --bulk 8 and
                            --recompute 2 end with plain training's
                            weights_digest and val_loss, bit for bit
  empty TRAINER [ARGS...]   an empty text: exit 2, stderr names the file
  context TRAINER [ARGS...] --model tiny --context 129: exit 2 at parse time,
                            stderr names both contexts
  pipeline TRAINER [ARGS...] --devices cpu:0,cpu:1 --pipeline S for gpipe,
                            1f1b, zb-h1 and interleaved-1f1b: each
                            validation loss within 1e-4 of one device's
                            data-parallel run; --pipeline with --shard is
                            refused naming --shard

usage: check_gpt_train.py MODE [--expect KEY=VALUE]... TRAINER [ARGS...]
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

WORDS = ("the and of to in that he shall unto for his i a they be is him not them it with all thou thy was "
         "which my lord their have will from ye as were are but when this then there so upon by said came "
         "house king people land day earth went made men son god before hand").split()


def write_text(path, size=20000):
    rng = random.Random(0)
    parts = []
    total = 0
    while total < size:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14)))
        sentence = sentence[0].upper() + sentence[1:] + ".\n"
        parts.append(sentence)
        total += len(sentence)
    with open(path, "w") as f:
        f.write("".join(parts))


def run(cmd, expect=0):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != expect:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode} (expected {expect}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def lines_of(proc, cmd):
    evals = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith('{"eval"')]
    summary = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith('{"model"')]
    if not summary:
        sys.exit(f"{' '.join(cmd)} printed no summary JSON line:\n{proc.stdout}")
    return evals, summary[-1]


def flag(args, name, default=None):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "resume", "same", "empty", "context", "pipeline"])
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("trainer")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    o = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-gpt-")
    try:
        text = os.path.join(work, "text.txt")
        write_text(text)
        base = [o.trainer, *o.args, "--data", text, "--json"]
        if o.mode == "run":
            proc = run(base)
            evals, s = lines_of(proc, base)
            steps = int(flag(o.args, "--steps", "200"))
            every = int(flag(o.args, "--eval-every", "50"))
            for key in ("val_loss", "train_loss"):
                if s[key] is None or not math.isfinite(s[key]) or s[key] <= 0:
                    sys.exit(f"{key} is {s[key]}: want a positive finite loss\n{proc.stdout}")
            if not s["tokens_per_s"] > 0:
                sys.exit(f"tokens_per_s is {s['tokens_per_s']}\n{proc.stdout}")
            if flag(o.args, "--minutes"):
                # Stopped by the clock: fewer steps than asked, the last one evaluated.
                if not s["minutes_reached"] or not 0 < s["steps"] < steps:
                    sys.exit(f"--minutes: ran {s['steps']} of {steps} steps, minutes_reached "
                             f"{s['minutes_reached']}\n{proc.stdout}")
                steps = s["steps"]
            elif s["steps"] != steps:
                sys.exit(f"ran {s['steps']} steps, asked for {steps}\n{proc.stdout}")
            want_evals = sorted(set(list(range(every, steps + 1, every)) + [steps]))
            if [e["eval"] for e in evals] != want_evals:
                sys.exit(f"evaluations at {[e['eval'] for e in evals]}, want {want_evals}\n{proc.stdout}")
            # A byte-level model starts near ln(256) = 5.55 nats per byte.
            if not evals[0]["val_loss"] < 6.5:
                sys.exit(f"the first validation loss {evals[0]['val_loss']} is above 6.5 (ln 256 = 5.55)\n{proc.stdout}")
            for e in o.expect:
                key, value = e.split("=", 1)
                if str(s.get(key)).lower() != value.lower():
                    sys.exit(f"{key} is {s.get(key)!r}, want {value}\n{proc.stdout}")
            print(f"trained {steps} steps: val loss {evals[0]['val_loss']:.4f} -> {s['val_loss']:.4f}, "
                  f"{s['tokens_per_s']:.0f} tokens/s, {s['replicas']} replicas, {s['precision']}, shard {s['shard']}")
        elif o.mode == "resume":
            run_dir = os.path.join(work, "run")
            ref_cmd = [*base, "--steps", "6", "--eval-every", "3"]
            _, ref = lines_of(run(ref_cmd), ref_cmd)
            first_cmd = [*base, "--steps", "3", "--eval-every", "3", "--checkpoint", run_dir]
            run(first_cmd)
            resume_cmd = [*base, "--steps", "6", "--eval-every", "3", "--resume", run_dir]
            proc = run(resume_cmd)
            _, resumed = lines_of(proc, resume_cmd)
            if "resumed from" not in proc.stdout:
                sys.exit(f"the resumed run does not say it resumed:\n{proc.stdout}")
            if resumed["resumed_at_step"] != 3 or resumed["steps"] != 6 or resumed["trained_steps"] != 3:
                sys.exit(f"resumed at {resumed['resumed_at_step']}, ended at {resumed['steps']} after "
                         f"{resumed['trained_steps']} steps: want 3, 6, 3")
            for key in ("weights_digest", "val_loss"):
                if resumed[key] != ref[key]:
                    sys.exit(f"{key}: {ref[key]} unbroken, {resumed[key]} resumed")
            ctx = int(flag(o.args, "--context", "0") or 0)
            refused = run([*base, "--steps", "6", "--resume", run_dir, "--context", str(max(ctx - 1, 1))], expect=2)
            if "--context" not in refused.stderr:
                sys.exit(f"resuming with another context: stderr does not name --context: {refused.stderr!r}")
            print(f"resumed at step 3: the same weights ({ref['weights_digest']}) and val loss {ref['val_loss']}")
        elif o.mode == "same":
            _, ref = lines_of(run(base), base)
            for extra in (["--hybridize"], ["--bulk", "8"], ["--recompute", "2"]):
                cmd = [*base, *extra]
                _, other = lines_of(run(cmd), cmd)
                for key in ("weights_digest", "val_loss", "train_loss"):
                    if other[key] != ref[key]:
                        sys.exit(f"{' '.join(extra)}: {key} {other[key]}, plain training {ref[key]}")
            print(f"--hybridize, --bulk 8, --recompute 2: the same weights ({ref['weights_digest']}) as plain training")
        elif o.mode == "pipeline":
            _, ref = lines_of(run(base), base)
            for schedule in ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b"):
                cmd = [*base, "--devices", "cpu:0,cpu:1", "--pipeline", schedule]
                evals, got = lines_of(run(cmd), cmd)
                if got["pipeline"] != schedule or got["steps"] != ref["steps"]:
                    sys.exit(f"{schedule}: ran {got['pipeline']} for {got['steps']} steps, want {ref['steps']}")
                if not abs(got["val_loss"] - ref["val_loss"]) <= 1e-4 * abs(ref["val_loss"]):
                    sys.exit(f"{schedule}: val loss {got['val_loss']}, one device's data-parallel run {ref['val_loss']}")
                print(f"{schedule} over 2 devices, balance {got['balance']}: val loss {got['val_loss']:.6f} "
                      f"(one device {ref['val_loss']:.6f})")
            proc = run([*base, "--devices", "cpu:0,cpu:1", "--pipeline", "1f1b", "--shard", "parameters"], expect=2)
            if "--shard" not in proc.stderr:
                sys.exit(f"--pipeline with --shard: stderr does not name --shard: {proc.stderr!r}")
            print("pipelined under every schedule: the data-parallel run's validation loss")
        elif o.mode == "empty":
            empty = os.path.join(work, "empty.txt")
            open(empty, "w").close()
            cmd = [o.trainer, *o.args, "--data", empty]
            proc = run(cmd, expect=2)
            if empty not in proc.stderr or "empty" not in proc.stderr:
                sys.exit(f"stderr does not name the empty file {empty}: {proc.stderr!r}")
            print(f"refused: {proc.stderr.strip()}")
        else:
            cmd = [o.trainer, *o.args, "--model", "tiny", "--context", "129", "--data", text]
            proc = run(cmd, expect=2)
            if "--context 129" not in proc.stderr or "context 128" not in proc.stderr:
                sys.exit(f"stderr does not name both contexts: {proc.stderr!r}")
            if "data:" in proc.stdout:
                sys.exit(f"refused only after reading the data (want: at parse time):\n{proc.stdout}")
            print(f"refused: {proc.stderr.strip()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
