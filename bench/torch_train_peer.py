#!/usr/bin/env python3
"""PyTorch peer of weft-train-lenet / weft-train-resnet on one GPU, and of weft-train-gpt.

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

--model gpt is the peer of weft-train-gpt (weft::nn::gpt, nanoGPT's layout)
on the CPU or one GPU: a byte-level language model trained on a text file's
bytes (default $WEFT_TEXT_CORPUS, else /usr/local/share/weft/kjv.txt), the
same batches as weft::TextCorpus draws (an mt19937_64 per step, unbiased
bounded draw), the same validation windows, AdamW (or SGD, Adam) as
torch.optim computes them. It times --steps - --warmup training steps and
prints a JSON line every --report-every steps and a summary line
(tokens_per_s, step_ms median, val_loss, params, torch version, attention
form). See bench/README.md, "The PyTorch peer of GPT".

  python3 bench/torch_train_peer.py --model gpt --gpt tiny --context 128 --batch-size 16 --steps 20 --threads 2
"""
import argparse
import contextlib
import gzip
import json
import os
import time
import warnings

import numpy as np
import torch
from torch import nn

from text_batches import CorpusError, TextCorpus


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


# ---------------------------------------------------------------------------
# GPT: the peer of weft-train-gpt (weft::nn::gpt and weft::TextCorpus).

GPT_CONFIGS = {
    # weft::nn::GptConfig::tiny() and ::small()
    "tiny": dict(vocab=256, context=128, layers=4, heads=4, width=128),
    "small": dict(vocab=50257, context=1024, layers=12, heads=12, width=768),
}


def describe(cfg):
    """GptConfig::describe()'s wording."""
    return "layers {layers}, heads {heads}, width {width}, context {context}, vocab {vocab}".format(**cfg)


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.register_buffer("mask", None, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)  # q, k, v in that order, as Weft's c_attn
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # PyTorch < 2: the explicit form, causal mask by -inf before a softmax over keys.
            if self.mask is None or self.mask.shape[-1] < t or self.mask.device != x.device:
                n = max(t, 1)
                self.mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.shape[-1] ** 0.5))
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width, heads, eps, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=eps)
        self.attn = CausalSelfAttention(width, heads, sdpa)
        self.ln_2 = nn.LayerNorm(width, eps=eps)
        self.mlp = Mlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """nanoGPT's GPT without dropout: wte + wpe, blocks h.0 .. h.{L-1}, ln_f, lm_head tied to wte."""

    def __init__(self, cfg, sdpa, eps=1e-5):
        super().__init__()
        width = cfg["width"]
        self.wte = nn.Embedding(cfg["vocab"], width)
        self.wpe = nn.Embedding(cfg["context"], width)
        self.h = nn.ModuleList(Block(width, cfg["heads"], eps, sdpa) for _ in range(cfg["layers"]))
        self.ln_f = nn.LayerNorm(width, eps=eps)
        self.lm_head = nn.Linear(width, cfg["vocab"], bias=False)
        self.lm_head.weight = self.wte.weight
        # weft::nn::gpt's initialization: GPT-2's standard deviations (0.02;
        # the blocks' c_proj 0.02 / sqrt(2 L)) drawn as U(-a, a), a = stddev * sqrt(3);
        # biases 0, layer norms 1 and 0.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.startswith("ln") or ".ln_" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / (2 * cfg["layers"]) ** 0.5 if name.endswith("c_proj.weight") else 0.02
                nn.init.uniform_(p, -std * 3 ** 0.5, std * 3 ** 0.5)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def windows(corpus, offsets):
    """inputs [B, T] and targets [B, T] (each input's next byte) as int64 tensors."""
    w = corpus.array[np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(corpus.context + 1)].astype(np.int64)
    return torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy())


def gpt_optimizer(args, params):
    wd = args.weight_decay
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, weight_decay=wd or 0.0)
    if args.optimizer == "momentum":
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=wd or 0.0)
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=args.lr, weight_decay=wd or 0.0)
    # weft::optim::OptimizerOptions::adamw: betas (0.9, 0.999), eps 1e-8, decay 0.01 on every parameter.
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01 if wd is None else wd)


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def train_gpt(args):
    cfg = dict(GPT_CONFIGS[args.gpt])
    context = args.context or cfg["context"]
    if not 0 < context <= cfg["context"]:
        raise SystemExit(f"torch_train_peer: --context {context}: GPT {args.gpt} takes 1 to {cfg['context']} tokens")
    if args.steps <= args.warmup:
        raise SystemExit(f"torch_train_peer: --steps {args.steps} must exceed --warmup {args.warmup} "
                         "(the timed steps are those after the warm-up)")
    if args.batch_size <= 0 or args.eval_batches <= 0 or args.report_every <= 0:
        raise SystemExit("torch_train_peer: --batch-size, --eval-batches and --report-every must be positive")
    threads = args.threads or cpu_count()
    torch.set_num_threads(threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_train_peer: --device cuda: PyTorch sees no GPU")
        dev = torch.device("cuda:0")
        device_name = torch.cuda.get_device_name(0)
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    else:
        dev = torch.device("cpu")
        device_name = "cpu"
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    if half is not None:
        # PyTorch 1.13's CPU autocast knows bfloat16 only: with float16 it warns and turns itself off.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with torch.autocast(dev.type, dtype=half):
                    on = torch.is_autocast_cpu_enabled() if dev.type == "cpu" else torch.is_autocast_enabled()
            except RuntimeError:
                on = False
        if not on:
            raise SystemExit(f"torch_train_peer: --precision {args.precision} on --device {args.device}: "
                             f"PyTorch {torch.__version__}'s autocast does not support {half} there")
    sdpa = hasattr(nn.functional, "scaled_dot_product_attention")
    if args.attention == "explicit":
        sdpa = False
    elif args.attention == "sdpa" and not sdpa:
        raise SystemExit(f"torch_train_peer: --attention sdpa: PyTorch {torch.__version__} has no "
                         "F.scaled_dot_product_attention (it came in 2.0)")
    attention = "sdpa" if sdpa else "explicit"

    try:
        corpus = TextCorpus(args.text, context)
    except CorpusError as e:
        raise SystemExit(f"torch_train_peer: {e}")
    corpus.array = np.frombuffer(corpus.data, dtype=np.uint8)
    torch.manual_seed(args.seed)
    net = Gpt(cfg, sdpa).to(dev)
    params = sum(p.numel() for p in net.parameters())  # the tied weight once
    opt = gpt_optimizer(args, net.parameters())
    enabled = args.precision == "fp16"
    scaler = (torch.amp.GradScaler("cuda", enabled=enabled) if hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=enabled))
    b, t = args.batch_size, context

    def loss_of(x, y):
        with torch.autocast(dev.type, dtype=half) if half is not None else contextlib.nullcontext():
            logits = net(x)
        # weft::nn::lm_loss: mean cross-entropy in float32 over the B*T tokens, whatever the logits' dtype.
        return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # The batches' offsets are drawn before training (the pure-Python generator
    # costs about a millisecond a step); assembling and moving them is timed.
    offsets = [corpus.train_offsets(args.seed, s, b) for s in range(args.steps)]
    load_start = os.getloadavg()
    # No wait per step: the losses are read at each report, so on a GPU the
    # host runs ahead as it does in a training loop. The timed steps run from
    # a synchronize after the warm-up to one after the last step; a step's own
    # time is the host's time between step ends (the step's time once the
    # GPU's queue is full; on the CPU, where ops finish as they return, the
    # step itself).
    step_seconds, losses, value = [], [], float("nan")
    net.train()
    sync()
    timed_start = window_start = previous = time.perf_counter()
    window_steps = 0
    for s in range(args.steps):
        if s == args.warmup and s > 0:
            sync()
            timed_start = previous = time.perf_counter()
        x, y = windows(corpus, offsets[s])
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
        now = time.perf_counter()
        if s >= args.warmup:
            step_seconds.append(now - previous)
        previous = now
        window_steps += 1
        if (s + 1) % args.report_every == 0 or s + 1 == args.steps:
            values = [float(v) for v in losses]  # waits for the window's steps
            value = values[-1]
            now = time.perf_counter()
            print(json.dumps({"step": s + 1, "loss": sum(values) / len(values),
                              "step_ms": 1e3 * step_seconds[-1] if s >= args.warmup else None,
                              "timed": s >= args.warmup,
                              "tokens_per_s": window_steps * b * t / (now - window_start)}), flush=True)
            losses, window_start, window_steps = [], now, 0
            previous = now
    sync()
    timed_seconds = time.perf_counter() - timed_start
    load_end = os.getloadavg()

    net.eval()
    val = 0.0
    with torch.no_grad():
        for i in range(args.eval_batches):
            x, y = windows(corpus, corpus.validation_offsets(i, args.eval_batches, b))
            val += float(loss_of(x.to(dev), y.to(dev)))
    ordered = sorted(step_seconds)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] +
                                                                  ordered[len(ordered) // 2]) / 2
    print(json.dumps({
        "impl": "pytorch", "model": "gpt", "gpt": args.gpt, "config": describe(cfg),
        "torch": torch.__version__, "attention": attention, "device": device_name, "threads": threads,
        "interop_threads": torch.get_num_interop_threads(), "precision": args.precision,
        "optimizer": args.optimizer, "lr": args.lr, "weight_decay": opt.param_groups[0]["weight_decay"],
        "batch_size": b, "context": t, "steps": args.steps, "warmup": args.warmup,
        "timed_steps": len(step_seconds), "params": params,
        "tokens_per_s": len(step_seconds) * b * t / timed_seconds,
        "step_ms": 1e3 * median, "step_ms_min": 1e3 * ordered[0], "step_ms_max": 1e3 * ordered[-1],
        "loss": value, "val_loss": val / args.eval_batches, "eval_batches": args.eval_batches,
        "text": corpus.path, "text_bytes": int(len(corpus.data)),
        "loadavg_start": load_start[0], "loadavg_end": load_end[0], "cpus": cpu_count()}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["lenet", "resnet18", "gpt"], default="lenet")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=None, help="default: 256 (lenet, resnet18), 16 (gpt)")
    ap.add_argument("--lr", type=float, default=None,
                    help="default: 0.3 (lenet), 0.1 (resnet18), as Weft's; gpt: 0.001 with adam and adamw, else 0.1")
    ap.add_argument("--limit", type=int, default=0, help="only the first N training and test examples")
    ap.add_argument("--data", default=os.environ.get("WEFT_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default=None,
                    help="as the Weft trainers' --precision (default tf32: PyTorch's default for convolutions; "
                         "gpt: tf32 on cuda, fp32 on the CPU)")
    ap.add_argument("--conv-algo", default="heuristic",
                    choices=["heuristic", "benchmark", "deterministic", "benchmark+deterministic"])
    ap.add_argument("--channels-last", action="store_true", help="NHWC activations and weights")
    ap.add_argument("--fp32", action="store_true", help="the same as --precision fp32")
    ap.add_argument("--deterministic", action="store_true", help="the same as --conv-algo deterministic")
    gpt = ap.add_argument_group("--model gpt")
    gpt.add_argument("--gpt", choices=sorted(GPT_CONFIGS), default="tiny",
                     help="GptConfig::tiny() (bytes, 4 layers of width 128) or ::small() (GPT-2 small)")
    gpt.add_argument("--context", type=int, default=0, help="tokens per sequence T (default: the config's)")
    gpt.add_argument("--steps", type=int, default=20, help="training steps, warm-up included (default 20)")
    gpt.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing (default 3)")
    gpt.add_argument("--optimizer", choices=["sgd", "momentum", "adam", "adamw"], default=None,
                     help="default adamw (lenet and resnet18 train with plain SGD)")
    gpt.add_argument("--weight-decay", type=float, default=None, help="default: 0.01 (adamw), 0 (the others)")
    gpt.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    gpt.add_argument("--threads", type=int, default=0,
                     help="torch.set_num_threads (default: the CPUs this process may run on)")
    gpt.add_argument("--text", default=os.environ.get("WEFT_TEXT_CORPUS") or "/usr/local/share/weft/kjv.txt",
                     help="the corpus (default $WEFT_TEXT_CORPUS, else /usr/local/share/weft/kjv.txt)")
    gpt.add_argument("--eval-batches", type=int, default=8, help="validation batches at the end (default 8)")
    gpt.add_argument("--report-every", type=int, default=10, help="a JSON line every N steps (default 10)")
    gpt.add_argument("--attention", choices=["auto", "sdpa", "explicit"], default="auto",
                     help="auto: F.scaled_dot_product_attention where PyTorch has it (>= 2.0), else explicit")
    args = ap.parse_args()
    if args.fp32:
        args.precision = "fp32"
    if args.model == "gpt":
        if args.optimizer is None:
            args.optimizer = "adamw"
        if args.batch_size is None:
            args.batch_size = 16
        if args.precision is None:
            args.precision = "tf32" if args.device == "cuda" else "fp32"
        if args.lr is None:
            args.lr = 0.001 if args.optimizer in ("adam", "adamw") else 0.1
        if args.threads < 0:
            raise SystemExit(f"torch_train_peer: --threads {args.threads} must be positive (0: every CPU)")
        return train_gpt(args)
    if args.optimizer is not None or args.weight_decay is not None:
        raise SystemExit(f"torch_train_peer: --optimizer and --weight-decay are --model gpt's; "
                         f"{args.model} trains with plain SGD as Weft's trainer does by default")
    if args.batch_size is None:
        args.batch_size = 256
    if args.precision is None:
        args.precision = "tf32"
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
