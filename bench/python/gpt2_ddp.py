#!/usr/bin/python3
"""The Python anchor for dt's trainer benchmarks: the same GPT-2 (pre-LayerNorm, tanh GELU, tied
head, causal attention written with matmul + mask as dttrainer does), AdamW, PyTorch DDP over Gloo.
Run under torchrun (python3-torch 1.13):

  python3 -m torch.distributed.run --standalone --nproc_per_node N --redirects 1 --tee 1 gpt2_ddp.py [flags]

Prints "DT_BENCH_FIRST_STEP" from rank 0 after the first optimizer step and, at the end, one JSON
line "DT_BENCH_RESULT {...}" with the per-step times of rank 0. gpt2_gpu.py (the single-process GPU
anchor) imports this file's model classes.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, n_embd, n_head, n_pos):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("mask", torch.ones(n_pos, n_pos).tril().view(1, 1, n_pos, n_pos))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.n_head))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, n_pos):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = Attention(n_embd, n_head, n_pos)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab, n_pos, n_embd, n_layer, n_head):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(n_pos, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, n_pos) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("c_proj", "mlp_proj")) else 0.02
                nn.init.normal_(m.weight, 0.0, std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def add_shape_arguments(ap, n_embd, n_layer, n_head, seq_len, batch_size, steps):
    """The model, batch and step flags of both anchors (this one and gpt2_gpu.py), with the given
    defaults."""
    ap.add_argument("--n-embd", type=int, default=n_embd)
    ap.add_argument("--n-layer", type=int, default=n_layer)
    ap.add_argument("--n-head", type=int, default=n_head)
    ap.add_argument("--n-positions", type=int, default=seq_len)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq-len", type=int, default=seq_len)
    ap.add_argument("--batch-size", type=int, default=batch_size)
    ap.add_argument("--steps", type=int, default=steps, help="timed steps")


def main():
    ap = argparse.ArgumentParser()
    add_shape_arguments(ap, n_embd=128, n_layer=4, n_head=4, seq_len=128, batch_size=4, steps=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1337)
    model = GPT2(args.vocab, args.n_positions, args.n_embd, args.n_layer, args.n_head)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(1000 + rank)
    times = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=gen)
        loss = ddp(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        if step == 1:
            dist.barrier()
            if rank == 0:
                print("DT_BENCH_FIRST_STEP", flush=True)
    if rank == 0:
        print("DT_BENCH_RESULT " + json.dumps({"step_times": times, "world": world}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
