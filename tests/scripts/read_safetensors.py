#!/usr/bin/env python3
"""Reads safetensors files and Weft checkpoint directories with Python's
standard library only (struct, json), from the format's definition:

  8 bytes   little-endian u64 N, the header's length
  N bytes   JSON: {name: {"dtype", "shape", "data_offsets": [begin, end]},
                   "__metadata__": {str: str}}
  the rest  the tensors' little-endian bytes; offsets from the data's start

Usage:
  read_safetensors.py FILE.safetensors|CHECKPOINT_DIR ...   print what they hold
  read_safetensors.py --check OUT_DIR       compare OUT_DIR/ckpt and
                                            OUT_DIR/plain.safetensors with
                                            OUT_DIR/expect.json
  read_safetensors.py --writer EXE --work DIR   empty DIR, run EXE DIR, then --check DIR

Exit status: 0 when everything matches, 1 (naming the tensor) otherwise.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2}


class Mismatch(Exception):
    pass


def parse(path):
    """The header of a safetensors file (validated), its metadata and data start."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Mismatch(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise Mismatch(f"{path}: header length {n} runs past the end")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n :]
    spans = []
    for name, info in header.items():
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SIZES:
            raise Mismatch(f"{path}: tensor {name!r}: dtype {dtype}")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * SIZES[dtype]:
            raise Mismatch(f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} of {dtype}")
        spans.append((begin, end, name))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            raise Mismatch(f"{path}: tensor {name!r}: data_offsets not contiguous")
        at = end
    if at != len(data):
        raise Mismatch(f"{path}: the tensors hold {at} bytes of {len(data)}")
    return header, metadata, data


def widened_bits(dtype, raw):
    """Each element's value widened to float32, as its u32 bit pattern."""
    count = len(raw) // SIZES[dtype]
    if dtype == "F32":
        return list(struct.unpack(f"<{count}I", raw))
    if dtype == "BF16":  # bfloat16: the upper 16 bits of a float32
        return [h << 16 for h in struct.unpack(f"<{count}H", raw)]
    # float16: IEEE half, which struct reads as 'e'; every half is a float32
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in struct.unpack(f"<{count}e", raw)]


def tensor_bytes(header, data, key):
    begin, end = header[key]["data_offsets"]
    return data[begin:end]


def read_checkpoint(directory):
    """{name: (dtype, shape, raw bytes)} of a checkpoint directory, its pieces
    put together by the index and, independently, by the shards' own
    "weft.pieces" metadata; both must agree."""
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    ranks = index["ranks"]
    shards = {}
    for r in range(ranks):
        name = f"rank-{r:05d}-of-{ranks:05d}.safetensors"
        shards[name] = parse(os.path.join(directory, name))
    by_index = {}
    for name, t in index["tensors"].items():
        size = SIZES[t["dtype"]]
        parts = sorted(t["pieces"], key=lambda p: p["begin"])
        raw = b""
        for p in parts:
            header, _, data = shards[p["file"]]
            if header[p["key"]]["dtype"] != t["dtype"]:
                raise Mismatch(f"{directory}: tensor {name!r}: piece dtype differs from the index's")
            piece = tensor_bytes(header, data, p["key"])
            if len(piece) != (p["end"] - p["begin"]) * size:
                raise Mismatch(f"{directory}: tensor {name!r}: piece size differs from its range")
            raw += piece
        by_index[name] = (t["dtype"], t["shape"], raw)
        files = index["weight_map"][name]
        files = [files] if isinstance(files, str) else files
        if sorted(files) != sorted({p["file"] for p in parts}):
            raise Mismatch(f"{directory}: tensor {name!r}: weight_map {files} differs from its pieces")
    # The same from the shards alone.
    by_shards = {}
    for _, (header, metadata, data) in sorted(shards.items()):
        pieces = json.loads(metadata.get("weft.pieces", "{}"))
        for key, info in header.items():
            raw = tensor_bytes(header, data, key)
            if key in pieces:
                p = pieces[key]
                by_shards.setdefault(p["name"], [info["dtype"], p["shape"], []])[2].append((p["begin"], raw))
            else:
                by_shards.setdefault(key, [info["dtype"], info["shape"], []])[2].append((0, raw))
    for name, (dtype, shape, parts) in by_shards.items():
        raw = b"".join(r for _, r in sorted(parts, key=lambda p: p[0]))
        if by_index.get(name) != (dtype, shape, raw):
            raise Mismatch(f"{directory}: tensor {name!r}: the shards and the index disagree")
    if set(by_shards) != set(by_index):
        raise Mismatch(f"{directory}: the shards hold {sorted(by_shards)}, the index {sorted(by_index)}")
    return by_index, index["metadata"]


def read_plain(path):
    header, metadata, data = parse(path)
    return {k: (v["dtype"], v["shape"], tensor_bytes(header, data, k)) for k, v in header.items()}, metadata


def compare(what, tensors, metadata, expect):
    if metadata != expect["metadata"]:
        raise Mismatch(f"{what}: metadata {metadata} != {expect['metadata']}")
    names = {t["name"] for t in expect["tensors"]}
    if set(tensors) != names:
        raise Mismatch(f"{what}: tensors {sorted(tensors)} != {sorted(names)}")
    for t in expect["tensors"]:
        dtype, shape, raw = tensors[t["name"]]
        if dtype != t["dtype"] or shape != t["shape"]:
            raise Mismatch(f"{what}: tensor {t['name']!r}: {dtype} {shape}, want {t['dtype']} {t['shape']}")
        got = widened_bits(dtype, raw)
        if got != t["bits"]:
            i = next((i for i, (a, b) in enumerate(zip(got, t["bits"])) if a != b), min(len(got), len(t["bits"])))
            raise Mismatch(f"{what}: tensor {t['name']!r}: element {i} differs")
    print(f"{what}: {len(names)} tensors match (names, dtypes, shapes, bytes)")


def check(out_dir):
    with open(os.path.join(out_dir, "expect.json")) as f:
        expect = json.load(f)
    ckpt = os.path.join(out_dir, expect["checkpoint"])
    tensors, metadata = read_checkpoint(ckpt)
    compare(ckpt, tensors, metadata, expect)
    plain = os.path.join(out_dir, expect["plain"])
    tensors, metadata = read_plain(plain)
    compare(plain, tensors, metadata, expect)


def show(path):
    tensors, metadata = read_checkpoint(path) if os.path.isdir(path) else read_plain(path)
    print(f"{path}: metadata {json.dumps(metadata)}")
    for name, (dtype, shape, raw) in sorted(tensors.items()):
        print(f"  {name}: {dtype} {shape} ({len(raw)} bytes)")


def main(argv):
    try:
        if len(argv) == 2 and argv[0] == "--check":
            check(argv[1])
        elif len(argv) == 4 and argv[0] == "--writer" and argv[2] == "--work":
            shutil.rmtree(argv[3], ignore_errors=True)  # nothing left from an earlier run
            subprocess.run([argv[1], argv[3]], check=True)
            check(argv[3])
        elif argv and not argv[0].startswith("-"):
            for path in argv:
                show(path)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (Mismatch, OSError, ValueError, KeyError, subprocess.CalledProcessError) as e:
        print(f"read_safetensors.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
