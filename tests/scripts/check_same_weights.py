#!/usr/bin/env python3
"""Runs of a trainer that must end with bit for bit the same weights: TRAINER
with ARGS once per VARIANT (extra arguments, ';'-separated variants of
space-separated words), each run's JSON line compared with the first's
(weights_digest, training loss, test accuracy). For sharding: every ZeRO
stage on two members sums in the order unsharded training does.

usage: check_same_weights.py VARIANTS TRAINER [ARGS...]
  e.g. check_same_weights.py "--shard none;--shard parameters" weft-train-resnet --limit 64
"""
import json
import subprocess
import sys


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith('{"model"')]
    if not lines:
        sys.exit(f"{' '.join(cmd)} printed no JSON line:\n{proc.stdout}")
    return json.loads(lines[-1])


def main():
    variants = [v.split() for v in sys.argv[1].split(";")]
    trainer, args = sys.argv[2], sys.argv[3:]
    if len(variants) < 2:
        sys.exit("give at least two variants")
    first = run([trainer, *args, *variants[0], "--json"])
    for variant in variants[1:]:
        other = run([trainer, *args, *variant, "--json"])
        for key in ("weights_digest", "train_loss", "test_acc"):
            if other[key] != first[key]:
                sys.exit(f"{key}: {first[key]} with {' '.join(variants[0])}, {other[key]} with {' '.join(variant)}")
        print(f"{' '.join(variant)}: the same weights as {' '.join(variants[0])} ({first['weights_digest']}); "
              f"state bytes per member {other['state_bytes']} against {first['state_bytes']}")


if __name__ == "__main__":
    main()
