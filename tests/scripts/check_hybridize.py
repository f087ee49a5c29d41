#!/usr/bin/env python3
"""A trainer with --hybridize (one captured step replayed per batch) must
train exactly as without it: the same loss, training and test accuracy, to
the last digit the JSON line prints. Also: --hybridize over two devices is
refused with exit status 2 and a message naming the flag.

usage: check_hybridize.py TRAINER [trainer args...]
"""
import json
import subprocess
import sys


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith('{"model"')]
    if not lines:
        sys.exit(f"{' '.join(cmd)} printed no JSON line:\n{proc.stdout}")
    return json.loads(lines[-1])


def main():
    trainer, args = sys.argv[1], sys.argv[2:]
    plain = run([trainer, *args, "--json"])
    hybrid = run([trainer, *args, "--json", "--hybridize"])
    if plain["hybridize"] is not False or hybrid["hybridize"] is not True:
        sys.exit(f"the JSON lines do not say which run was hybridized: {plain} / {hybrid}")
    for key in ("train_loss", "train_acc", "test_acc"):
        if plain[key] != hybrid[key]:
            sys.exit(f"{key}: {plain[key]} without --hybridize, {hybrid[key]} with it")
    print(f"equal: train_loss {plain['train_loss']}, train_acc {plain['train_acc']}, test_acc {plain['test_acc']}; "
          f"ms per step {plain['ms_per_step']:.2f} plain, {hybrid['ms_per_step']:.2f} hybridized")
    refused = subprocess.run([trainer, *args, "--hybridize", "--devices", "cpu:0,cpu:1"], capture_output=True,
                             text=True, timeout=600)
    if refused.returncode != 2 or "--hybridize" not in refused.stderr:
        sys.exit(f"--hybridize on two devices: exit {refused.returncode}, stderr {refused.stderr!r}")


if __name__ == "__main__":
    main()
