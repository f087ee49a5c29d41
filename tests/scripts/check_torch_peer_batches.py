#!/usr/bin/env python3
"""The PyTorch peer of weft-train-gpt trains on weft::TextCorpus's batches.

Runs weft-test-text-corpus-dump (tests/ops/text_corpus_dump_main.cpp) over a
text written here and compares every training and validation batch it prints
with bench/text_batches.py's (what bench/torch_train_peer.py --model gpt
trains and validates on): the same window starts give the same input and
target ids. Cases: a few run values (the trainers' --seed), the first
steps and steps past 2^32 (the step's high word in the mixed sequence), a
small corpus, batch 1 and a single validation batch.

  check_torch_peer_batches.py --dump EXE --work DIR

Exit status: 0 when every batch matches, 1 at the first difference (named:
case, batch, row, position, both ids), 2 on bad arguments.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from text_batches import TextCorpus  # noqa: E402


def text(n, state):
    """n bytes of varied text: words of printable bytes from a 64-bit LCG, so windows differ by offset."""
    out = bytearray()
    while len(out) < n:
        state = (state * 6364136223846793005 + 1442695040888963407) & (2 ** 64 - 1)
        word = 1 + (state >> 60)
        for i in range(word):
            out.append(33 + ((state >> (8 * (i % 7))) & 0xFF) % 94)
        out.append(32)
    return bytes(out[:n])


def expected(corpus, kind, index, run, batch, eval_batches):
    offsets = (corpus.train_offsets(run, index, batch) if kind == "train"
               else corpus.validation_offsets(index, eval_batches, batch))
    x, y = [], []
    for o in offsets:
        xi, yi = corpus.window_ids(o)
        x += xi
        y += yi
    return {"x": x, "y": y}


def check(dump, path, context, run, first, steps, batch, eval_batches):
    name = f"{os.path.basename(path)} context {context} run {run} steps {first}..{first + steps - 1} batch {batch}"
    proc = subprocess.run([dump, path, str(context), str(run), str(first), str(steps), str(batch), str(eval_batches)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"FAIL {name}: the dump exited {proc.returncode}: {proc.stderr.strip()}")
    corpus = TextCorpus(path, context)
    lines = proc.stdout.splitlines()
    want = 2 * (steps + eval_batches)
    if len(lines) != want:
        raise SystemExit(f"FAIL {name}: the dump printed {len(lines)} lines, not {want}")
    cache = {}
    for line in lines:
        kind, index, half, *ids = line.split()
        index = int(index)
        key = (kind, index)
        if key not in cache:
            cache[key] = expected(corpus, kind, index, run, batch, eval_batches)
        mine = cache[key][half]
        ids = [int(v) for v in ids]
        if ids != mine:
            if len(ids) != len(mine):
                raise SystemExit(f"FAIL {name}: {kind} batch {index} {half}: Weft gave {len(ids)} ids, "
                                 f"the peer {len(mine)}")
            at = next(i for i in range(len(ids)) if ids[i] != mine[i])
            raise SystemExit(f"FAIL {name}: {kind} batch {index} {half}, row {at // context}, position "
                             f"{at % context}: Weft's id {ids[at]}, the peer's {mine[at]}")
    print(f"ok {name}: {steps} training and {eval_batches} validation batches of {batch} x {context}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="weft-test-text-corpus-dump")
    ap.add_argument("--work", required=True, help="a directory for the texts")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    big = os.path.join(args.work, "text-100003.txt")
    with open(big, "wb") as f:
        f.write(text(100003, 1))
    small = os.path.join(args.work, "text-700.txt")  # 630 training bytes: 598 window starts at context 32
    with open(small, "wb") as f:
        f.write(text(700, 2))
    check(args.dump, big, 64, 0, 0, 6, 4, 3)
    check(args.dump, big, 128, 12345, 3, 4, 16, 8)
    check(args.dump, big, 17, (1 << 40) + 7, (1 << 32) + 1, 3, 5, 1)
    check(args.dump, small, 32, 7, 0, 5, 1, 2)
    check(args.dump, small, 32, 0, 1 << 33, 2, 9, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
