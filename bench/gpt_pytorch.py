#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel (Python, gloo, one process per rank) on the character-level
GPT of examples/char_gpt: the same model, corpus split, sequences, seed handling and recipe
(AdamW, warm-up then cosine, clipping at 1.0), the baseline bench/gpt_vs_pytorch.sh runs beside
ddp. Prints the validation loss every --eval-every steps and at the end, and tokens/s of the
training steps alone (evaluation not counted).

  /usr/bin/python3 bench/gpt_pytorch.py --ranks 2 --steps 300
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):  # examples/char_gpt_torch/gpt_torch.hpp, layer for layer
    def __init__(self, a):
        super().__init__()
        self.heads, self.causal = a.heads, not a.no_mask
        self.c_attn = nn.Linear(a.width, 3 * a.width)
        self.c_proj = nn.Linear(a.width, a.width)
        self.future = torch.ones(a.context, a.context, dtype=torch.bool).triu(1)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d))
        if self.causal:
            scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
        p = torch.softmax(scores, -1, dtype=torch.float32)
        return self.c_proj((p @ v).transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.ln_1 = nn.LayerNorm(a.width)
        self.attn = Attention(a)
        self.ln_2 = nn.LayerNorm(a.width)
        self.mlp = MLP(a.width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(256, a.width)
        self.wpe = nn.Embedding(a.context, a.width)
        self.h = nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.ln_f = nn.LayerNorm(a.width)
        with torch.no_grad():  # nanoGPT's initialisation
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif name.startswith("ln_") or ".ln_" in name:
                    p.fill_(1.0)
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * a.layers))
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, tokens):  # B x T -> (B*T) x 256, the head tied to wte
        b, t = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        return (self.ln_f(x) @ self.wte.weight.t()).view(b * t, 256)


# examples/char_gpt/corpus.hpp's split: these files concatenated in this order; the last tenth of
# the bytes is the validation text.
CORPUS_FILES = [
    "art", "ascii-art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education", "ethnic",
    "food", "fortunes", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie", "literature",
    "love", "magic", "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people", "perl", "pets",
    "platitudes", "politics", "pratchett", "riddles", "science", "songs-poems", "sports", "startrek", "tao",
    "translate-me", "wisdom", "work", "zippy"]


def load_corpus(directory):
    data = b"".join(open(os.path.join(directory, n), "rb").read() for n in CORPUS_FILES)
    cut = len(data) - len(data) // 10
    return data[:cut], data[cut:]


def windows(text, length, limit=0):
    """corpus.hpp's windows: window i is bytes [i * length, i * length + length], tokens then
    targets shifted by one; with `limit`, that many windows spread evenly over the text."""
    every = (len(text) - 1) // length
    count = min(every, limit) if limit else every
    t = torch.frombuffer(bytearray(text[:every * length + 1]), dtype=torch.uint8).long()
    x = t[:every * length].view(every, length)
    y = t[1:every * length + 1].view(every, length)
    if count != every:
        keep = torch.tensor([i * every // count for i in range(count)])
        x, y = x[keep], y[keep]
    return x, y


def lr_factor(a, step):
    """examples/char_gpt's schedule (ddp::optim::schedule::linear_warmup(warmup, cosine(steps, floor))):
    a linear ramp over the first --warmup steps times a cosine over all --steps down to --min-lr."""
    ramp = (step + 1) / a.warmup if step < a.warmup else 1.0
    floor = a.min_lr / a.lr
    return ramp * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * step / a.steps)))


def validation_loss(model, vx, vy, rank, ranks):
    """Mean cross-entropy over every position of the validation windows, each rank its share."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(rank * 32, len(vx), 32 * ranks):
            logits = model(vx[i:i + 32])
            total[0] += F.cross_entropy(logits, vy[i:i + 32].reshape(-1), reduction="sum").double()
            total[1] += vy[i:i + 32].numel()
    dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def rank_main(rank, a, result):
    torch.set_num_threads(1)  # as ddp: the ranks are the parallelism
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=a.ranks)
    torch.manual_seed(a.seed)
    model = GPT(a)
    ddp_model = nn.parallel.DistributedDataParallel(model)
    decay = [p for n, p in model.named_parameters() if not (n.endswith(".bias") or "ln_" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or "ln_" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, a.beta2), eps=1e-8)
    train, validation = load_corpus(a.corpus)
    x, y = windows(train, a.context)
    vx, vy = windows(validation, a.context, a.final_eval_sequences)  # after the last step
    ex, ey = windows(validation, a.context, a.eval_sequences)  # every --eval-every steps
    sampler = torch.utils.data.distributed.DistributedSampler(range(len(x)), num_replicas=a.ranks, rank=rank,
                                                              seed=a.seed)
    step, epoch, seconds, tokens = 0, 0, 0.0, 0
    while step < a.steps:
        sampler.set_epoch(epoch)
        indices = torch.tensor(list(iter(sampler)))
        epoch += 1
        dist.barrier()
        start = time.perf_counter()
        for b in range(len(indices) // a.batch):
            if step == a.steps:
                break
            idx = indices[b * a.batch:(b + 1) * a.batch]
            for group in opt.param_groups:
                group["lr"] = a.lr * lr_factor(a, step)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp_model(x[idx]), y[idx].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            step += 1
            tokens += a.batch * a.context * a.ranks
            if a.eval_every and step % a.eval_every == 0 and step != a.steps:
                dist.barrier()
                seconds += time.perf_counter() - start
                v = validation_loss(ddp_model, ex, ey, rank, a.ranks)
                if rank == 0:
                    print(f"step {step}/{a.steps}  validation loss {v:.4f} ({len(ex)} sequences)  "
                          f"{tokens / seconds:.0f} tokens/s", flush=True)
                start = time.perf_counter()
        dist.barrier()
        seconds += time.perf_counter() - start
    v = validation_loss(ddp_model, vx, vy, rank, a.ranks)
    if rank == 0:
        result["tokens_per_second"] = tokens / seconds
        result["validation"] = v
        result["seconds"] = seconds
    dist.barrier()
    # PyTorch 1.13's teardown can deadlock here: the DDP reducer's gloo process group joins a
    # worker thread that waits for the GIL. The result is handed over: leave without it.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=12, help="sequences per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-sequences", type=int, default=512,
                   help="validation sequences, spread evenly, evaluated every --eval-every steps (0: all)")
    p.add_argument("--final-eval-sequences", type=int, default=0, help="validation sequences evaluated at the end (0: all)")
    p.add_argument("--no-mask", action="store_true", help="attention without the causal mask (ablation)")
    p.add_argument("--corpus", default="/usr/share/games/fortunes")
    p.add_argument("--port", type=int, default=29531)
    a = p.parse_args()
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(rank_main, args=(a, result), nprocs=a.ranks)
        print(f"pytorch-ddp ranks {a.ranks} steps {a.steps}: {result['seconds']:.1f} s, "
              f"tokens/s {result['tokens_per_second']:.0f} validation loss {result['validation']:.4f}")


if __name__ == "__main__":
    main()
