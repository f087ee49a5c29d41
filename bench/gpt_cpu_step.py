#!/usr/bin/env python3
"""A GPT training step on the CPU, Weft against PyTorch, in one command.

Runs `weft-bench-ops --gpt --json` (forward, lm_loss, backward and AdamW of
Weft's GPT on cpu(0)) and the same step in PyTorch (a nanoGPT-style model
with the same layers and shapes: wte, wpe, pre-norm blocks with c_attn,
causal attention, c_proj, c_fc, tanh GELU, c_proj, ln_f, lm_head tied to
wte; AdamW lr 1e-3, weight decay 0.01) with torch.set_num_threads equal to
Weft's worker count (--torch-threads to change it). The two alternate for --rounds rounds, each timing
--reps steps, so that load from other processes lands on both. Prints JSON
lines (bench/README.md): Weft's and PyTorch's per-round lines, then per model
{"case":"gpt_cpu_step", "weft_tokens_per_s", "torch_tokens_per_s",
"ratio" (torch / weft tokens per second: the target is <= 1.2), ...}.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

MODELS = {
    # name: (layers, heads, width, context, vocab, default batch, seq)
    "tiny": (4, 4, 128, 128, 256, 16, 128),
    "6x384": (6, 6, 384, 256, 256, 8, 256),
}


def torch_step_times(torch, model_name, batch, threads, reps):
    import torch.nn as nn
    import torch.nn.functional as F

    layers, heads, width, context, vocab, _, seq = MODELS[model_name]
    torch.set_num_threads(threads)
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q = q.view(b, t, heads, c // heads).transpose(1, 2)
            k = k.view(b, t, heads, c // heads).transpose(1, 2)
            v = v.view(b, t, heads, c // heads).transpose(1, 2)
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
                att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(width)
            self.c_fc = nn.Linear(width, 4 * width)
            self.c_proj = nn.Linear(4 * width, width)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as Weft's

        def forward(self, ids):
            pos = torch.arange(ids.shape[1])
            x = self.wte(ids) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    model = Gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    pick = random.Random(2)  # fixed token ids, as Weft's run has
    ids = torch.tensor([[pick.randrange(vocab) for _ in range(seq)] for _ in range(batch)])
    targets = torch.tensor([[pick.randrange(vocab) for _ in range(seq)] for _ in range(batch)])

    def step():
        logits = model(ids)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    step()
    step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return times, "sdpa" if sdpa is not None else "masked_softmax"


def weft_step_lines(binary, model_name, batch, reps, profile):
    cmd = [binary, "--gpt", "--json", "--gpt-model", model_name, "--gpt-batch", str(batch), "--reps", str(reps)]
    if not profile:
        cmd.append("--gpt-no-profile")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weft-bench", default=os.path.join(here, "..", "build", "bench", "weft-bench-ops"),
                   help="the weft-bench-ops binary (default: build/bench/weft-bench-ops)")
    p.add_argument("--models", default="tiny,6x384", help="comma-separated: tiny, 6x384")
    p.add_argument("--batch", type=int, default=0, help="batch size (0: tiny 16, 6x384 8)")
    p.add_argument("--rounds", type=int, default=3, help="Weft / PyTorch alternations per model")
    p.add_argument("--reps", type=int, default=5, help="timed steps per round")
    p.add_argument("--profile", action="store_true", help="also print Weft's per-op breakdown (first round)")
    p.add_argument("--torch-only", action="store_true", help="PyTorch's step alone (no Weft binary)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch.set_num_threads (0: Weft's worker count, the same-call comparison)")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("gpt_cpu_step.py: PyTorch is not installed (Debian: apt-get install python3-torch)", file=sys.stderr)
        return 2
    for name in args.models.split(","):
        if name not in MODELS:
            print(f"gpt_cpu_step.py: unknown model '{name}' (tiny, 6x384)", file=sys.stderr)
            return 2
        layers, heads, width, context, vocab, default_batch, seq = MODELS[name]
        batch = args.batch or default_batch
        weft_ms, torch_ms, workers, attention = [], [], None, None
        for rnd in range(args.rounds):
            if not args.torch_only:
                lines = weft_step_lines(args.weft_bench, name, batch, args.reps, args.profile and rnd == 0)
                for line in lines:
                    line["round"] = rnd
                    print(json.dumps(line), flush=True)
                    if line.get("case") == "gpt_step":
                        workers = line["workers"]
                        weft_ms.append(line["step_ms"])
            threads = args.torch_threads or workers or int(os.environ.get("WEFT_CPU_WORKERS")
                                                         or len(os.sched_getaffinity(0)))
            times, attention = torch_step_times(torch, name, batch, threads, args.reps)
            median = statistics.median(times)
            torch_ms.append(median)
            print(json.dumps({"case": "torch_step", "model": name, "round": rnd, "batch": batch, "seq": seq,
                              "threads": threads, "attention": attention, "step_ms": round(median, 3),
                              "step_ms_min": round(min(times), 3), "step_ms_max": round(max(times), 3),
                              "tokens_per_s": round(batch * seq / (median * 1e-3), 1), "reps": args.reps}),
                  flush=True)
        tokens = batch * seq
        row = {"case": "gpt_cpu_step", "model": name, "layers": layers, "heads": heads, "width": width,
               "vocab": vocab, "batch": batch, "seq": seq, "threads": threads, "torch": torch.__version__,
               "torch_attention": attention, "rounds": args.rounds, "reps": args.reps,
               "torch_step_ms": round(statistics.median(torch_ms), 3),
               "torch_tokens_per_s": round(tokens / (statistics.median(torch_ms) * 1e-3), 1)}
        if weft_ms:
            row["weft_step_ms"] = round(statistics.median(weft_ms), 3)
            row["weft_tokens_per_s"] = round(tokens / (statistics.median(weft_ms) * 1e-3), 1)
            row["ratio"] = round(statistics.median(weft_ms) / statistics.median(torch_ms), 4)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
