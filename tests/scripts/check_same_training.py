#!/usr/bin/env python3
"""A trainer must train exactly as without them with each of its engine
modes: --hybridize (one captured step replayed per batch), --hybridize
--gpu-graphs (its GPU ops replayed as stream graphs: the run must say it
captured some, and no segment may fall back to op by op) and --bulk N (each
step's ops pushed in bulks): the same loss, training and test accuracy, to
the last digit the JSON line prints. Also, with hybridize: --hybridize over
two devices is refused with exit status 2 and a message naming the flag.

usage: check_same_training.py MODES TRAINER [trainer args...]
  MODES  comma-separated: hybridize, graphs, bulk
"""
import json
import re
import subprocess
import sys

FLAGS = {"hybridize": ["--hybridize"], "graphs": ["--hybridize", "--gpu-graphs"], "bulk": ["--bulk", "16"]}


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith('{"model"')]
    if not lines:
        sys.exit(f"{' '.join(cmd)} printed no JSON line:\n{proc.stdout}")
    if "--gpu-graphs" in cmd:
        graphs = re.findall(r"ops in (\d+) stream graphs", proc.stdout)
        if not graphs or int(graphs[0]) == 0:
            sys.exit(f"{' '.join(cmd)} captured no stream graph:\n{proc.stdout}")
        if "runs op by op" in proc.stderr:
            sys.exit(f"{' '.join(cmd)}: a stream graph fell back to op by op:\n{proc.stderr}")
    return json.loads(lines[-1])


def main():
    modes = sys.argv[1].split(",")
    trainer, args = sys.argv[2], sys.argv[3:]
    unknown = [m for m in modes if m not in FLAGS]
    if unknown:
        sys.exit(f"unknown mode(s) {unknown}; known: {', '.join(FLAGS)}")
    plain = run([trainer, *args, "--json"])
    if plain["hybridize"] is not False or plain["gpu_graphs"] is not False or plain["bulk"] != 0:
        sys.exit(f"the plain run's JSON line says it was not plain: {plain}")
    for mode in modes:
        other = run([trainer, *args, "--json", *FLAGS[mode]])
        if mode == "bulk":
            said = other["bulk"] == int(FLAGS[mode][1])
        else:
            said = other["hybridize"] is True and other["gpu_graphs"] is (mode == "graphs")
        if not said:
            sys.exit(f"the JSON line of the {mode} run does not say so: {other}")
        for key in ("train_loss", "train_acc", "test_acc"):
            if plain[key] != other[key]:
                sys.exit(f"{key}: {plain[key]} plain, {other[key]} with {' '.join(FLAGS[mode])}")
        print(f"{mode}: equal: train_loss {plain['train_loss']}, train_acc {plain['train_acc']}, "
              f"test_acc {plain['test_acc']}; ms per step {plain['ms_per_step']:.2f} plain, "
              f"{other['ms_per_step']:.2f} with {' '.join(FLAGS[mode])}")
    if "hybridize" in modes:
        refused = subprocess.run([trainer, *args, "--hybridize", "--devices", "cpu:0,cpu:1"], capture_output=True,
                                 text=True, timeout=600)
        if refused.returncode != 2 or "--hybridize" not in refused.stderr:
            sys.exit(f"--hybridize on two devices: exit {refused.returncode}, stderr {refused.stderr!r}")


if __name__ == "__main__":
    main()
