#!/usr/bin/env python3
"""The PyTorch peer of weft-train-gpt computes what weft::nn::gpt computes.

Runs weft-test-gpt-peer-dump (tests/ops/gpt_peer_dump_main.cpp), which
writes a small tied GPT's float32 weights, one batch, Weft's logits, loss
and every parameter's gradient to a safetensors file; loads the weights into
bench/torch_train_peer.py's GPT under the same names (the parameter names
must be the same set) and checks its logits, loss and gradients against
Weft's, with the explicit attention and, where PyTorch has it,
F.scaled_dot_product_attention.

  check_torch_peer_gpt.py --dump EXE --work DIR

Needs PyTorch: this interpreter's, else /usr/bin/python3's (Debian's
python3-torch); without either it prints a [weft-skip] line. Exit status 0
when everything matches (or skipped), 1 at the first difference (named).
"""
import argparse
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))


def find_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        pass
    other = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(other) and os.path.exists(other) and \
            subprocess.run([other, "-c", "import torch"], capture_output=True).returncode == 0:
        os.execv(other, [other] + sys.argv)
    return False


def read_safetensors(path):
    import torch
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise SystemExit(f"FAIL {path}: {name} is {e['dtype']}, the dump writes F32")
        begin, end = e["data_offsets"]
        values = struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])
        out[name] = torch.tensor(values, dtype=torch.float32).reshape(e["shape"])
    return out, meta


def close(what, got, want, rtol, atol):
    diff = (got - want).abs()
    bound = atol + rtol * want.abs().max()
    worst = float(diff.max())
    if worst > float(bound):
        at = int(diff.argmax())
        raise SystemExit(f"FAIL {what}: the peer differs from Weft by {worst:.3g} (bound {float(bound):.3g}) at flat "
                         f"index {at}: peer {float(got.flatten()[at]):.7g}, Weft {float(want.flatten()[at]):.7g}")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="weft-test-gpt-peer-dump")
    ap.add_argument("--work", required=True, help="a directory for the dump")
    args = ap.parse_args()
    if not find_torch():
        print("[weft-skip] no python3 here imports torch (Debian: apt-get install python3-torch)")
        return 0
    import torch
    import torch_train_peer as peer

    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "gpt.safetensors")
    proc = subprocess.run([args.dump, path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"FAIL the dump exited {proc.returncode}: {proc.stderr.strip()}")
    t, meta = read_safetensors(path)
    cfg = {k: int(meta[k]) for k in ("vocab", "context", "layers", "heads", "width")}
    forms = [False] + ([True] if hasattr(torch.nn.functional, "scaled_dot_product_attention") else [])
    torch.set_num_threads(1)
    for sdpa in forms:
        form = "sdpa" if sdpa else "explicit"
        net = peer.Gpt(cfg, sdpa)
        mine = dict(net.named_parameters())
        weft_names = {k[len("param."):] for k in t if k.startswith("param.")}
        if set(mine) != weft_names:
            raise SystemExit(f"FAIL parameter names: only the peer has {sorted(set(mine) - weft_names)}, only Weft "
                             f"has {sorted(weft_names - set(mine))}")
        with torch.no_grad():
            for name, p in mine.items():
                if tuple(p.shape) != tuple(t["param." + name].shape):
                    raise SystemExit(f"FAIL {name}: the peer's shape {tuple(p.shape)}, Weft's "
                                     f"{tuple(t['param.' + name].shape)}")
                p.copy_(t["param." + name])
        ids, targets = t["ids"].long(), t["targets"].long()
        logits = net(ids)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1))
        loss.backward()
        worst = close(f"{form}: logits", logits.detach(), t["logits"], 1e-5, 1e-6)
        close(f"{form}: loss", loss.detach().reshape(1), t["loss"], 1e-5, 1e-6)
        grads = 0.0
        for name, p in mine.items():
            grads = max(grads, close(f"{form}: {name}'s gradient", p.grad, t["grad." + name], 1e-4, 1e-7))
        print(f"ok {form} attention ({meta['config']}): loss {float(loss):.6f} (Weft {float(t['loss']):.6f}), "
              f"logits within {worst:.2g}, {len(mine)} gradients within {grads:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
