#!/usr/bin/env python3
"""PyTorch peer of weft-train-lenet / weft-train-resnet on one GPU.

The same models (weft::nn::lenet: conv 1->20 3x3, ReLU, avg-pool, conv 20->50
5x5, ReLU, avg-pool, dense 800->128, ReLU, dense 128->10; weft::nn::resnet18
with D2L's small stem for 28x28 inputs), the same data (Fashion-MNIST IDX
files, pixels / 255), plain SGD at the same learning rate and batch size,
shuffled each epoch. The whole training set lives on the GPU (the strongest
form of the peer: no input pipeline), so its seconds per epoch are the GPU
work plus PyTorch's per-op cost. Prints one JSON line per epoch, then a
summary line, like the Weft trainers' --json.

The precision choices are the trainers': --precision fp32 (no TF32 anywhere),
tf32 (PyTorch's defaults: TF32 convolutions; matmuls too, as Weft's tf32),
bf16 / fp16 (autocast to that dtype; fp16 with a GradScaler at its
defaults); --conv-algo heuristic | benchmark (cudnn.benchmark) |
deterministic | benchmark+deterministic; --channels-last for NHWC.

  python3 bench/torch_train_peer.py --model lenet --epochs 3 --data DIR
  python3 bench/torch_train_peer.py --model resnet18 --precision bf16 --conv-algo benchmark --channels-last
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
from torch import nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, name):
    def find(stem):
        for suffix in ("", ".gz"):
            p = os.path.join(data_dir, stem + suffix)
            if os.path.exists(p):
                return p
        raise SystemExit(f"torch_train_peer: no {stem}[.gz] in {data_dir}")
    images = read_idx(find(f"{name}-images-idx3-ubyte")).astype(np.float32) / 255.0
    labels = read_idx(find(f"{name}-labels-idx1-ubyte")).astype(np.int64)
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels)


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))


class Residual(nn.Module):
    def __init__(self, cin, cout, stride, projection):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Conv2d(cin, cout, 1, stride) if projection else None

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet18():
    layers = [nn.Conv2d(1, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU()]
    channels = 64
    for stage in range(1, 5):
        out = 64 if stage == 1 else channels * 2
        for block in range(2):
            first = block == 0 and stage > 1
            layers.append(Residual(channels if block == 0 else out, out, 2 if first else 1, first))
        channels = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["lenet", "resnet18"], default="lenet")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=None, help="default: 0.3 (lenet), 0.1 (resnet18), as Weft's")
    ap.add_argument("--limit", type=int, default=0, help="only the first N training and test examples")
    ap.add_argument("--data", default=os.environ.get("WEFT_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default="tf32",
                    help="as the Weft trainers' --precision (default tf32: PyTorch's default for convolutions)")
    ap.add_argument("--conv-algo", default="heuristic",
                    choices=["heuristic", "benchmark", "deterministic", "benchmark+deterministic"])
    ap.add_argument("--channels-last", action="store_true", help="NHWC activations and weights")
    ap.add_argument("--fp32", action="store_true", help="the same as --precision fp32")
    ap.add_argument("--deterministic", action="store_true", help="the same as --conv-algo deterministic")
    args = ap.parse_args()
    if args.fp32:
        args.precision = "fp32"
    if args.deterministic:
        args.conv_algo = "deterministic"
    if not torch.cuda.is_available():
        raise SystemExit("torch_train_peer: PyTorch sees no GPU")
    torch.backends.cudnn.allow_tf32 = args.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = "benchmark" in args.conv_algo
    torch.backends.cudnn.deterministic = "deterministic" in args.conv_algo
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    lr = args.lr if args.lr is not None else (0.3 if args.model == "lenet" else 0.1)
    dev = torch.device("cuda:0")
    torch.manual_seed(args.seed)
    x, y = load(args.data, "train")
    tx, ty = load(args.data, "t10k")
    if args.limit:
        x, y, tx, ty = x[:args.limit], y[:args.limit], tx[:args.limit], ty[:args.limit]
    x, y, tx, ty = x.to(dev), y.to(dev), tx.to(dev), ty.to(dev)
    x, tx = x.contiguous(memory_format=memory_format), tx.contiguous(memory_format=memory_format)
    net = (lenet() if args.model == "lenet" else resnet18()).to(dev).to(memory_format=memory_format)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
    skipped = 0
    loss_fn = nn.CrossEntropyLoss()
    n, b = x.shape[0], args.batch_size
    epochs = []
    for epoch in range(args.epochs):
        net.train()
        torch.cuda.synchronize()
        start = time.perf_counter()
        order = torch.randperm(n, device=dev)
        total_loss = torch.zeros((), device=dev)
        correct = torch.zeros((), device=dev, dtype=torch.int64)
        for i in range(0, n, b):
            idx = order[i:i + b]
            with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
                out = net(x[idx])
                loss = loss_fn(out.float(), y[idx])
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            if scaler.is_enabled():
                before = scaler.get_scale()
                scaler.update()
                skipped += scaler.get_scale() < before
            else:
                scaler.update()
            total_loss += loss.detach() * idx.numel()
            correct += (out.argmax(1) == y[idx]).sum()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        net.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
            test_correct = sum(int((net(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum())
                               for i in range(0, tx.shape[0], 1000))
        row = {"epoch": epoch + 1, "loss": float(total_loss) / n, "train_acc": float(correct) / n,
               "test_acc": test_correct / tx.shape[0], "seconds": seconds}
        epochs.append(row)
        print(json.dumps(row), flush=True)
    seconds = sorted(e["seconds"] for e in epochs[1:] or epochs)
    print(json.dumps({"impl": "pytorch", "model": args.model, "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0), "batch_size": b, "lr": lr,
                      "cudnn": torch.backends.cudnn.version(), "precision": args.precision,
                      "conv_algo": args.conv_algo, "channels_last": args.channels_last,
                      "loss_scale": scaler.get_scale() if scaler.is_enabled() else 1.0,
                      "skipped_steps": int(skipped), "examples": n,
                      "median_epoch_seconds_after_first": seconds[len(seconds) // 2],
                      "ms_per_step": 1e3 * seconds[len(seconds) // 2] / ((n + b - 1) // b),
                      "test_acc": epochs[-1]["test_acc"]}), flush=True)


if __name__ == "__main__":
    main()
