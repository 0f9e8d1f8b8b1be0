#!/usr/bin/env python3
"""A plain torchrun-style DDP script: it never imports dt.

A small character-level language model on Tiny Shakespeare, trained with DistributedDataParallel
over Gloo. It reads what torchrun gives every worker (RANK, WORLD_SIZE, MASTER_ADDR, ...), so it
runs the same under

    torchrun --standalone --nproc-per-node 2 examples/python/train_ddp.py --steps 100
    dtctl submit --name ddp --save-dir /tmp/runs --nproc-per-node 2 --max-restarts 2 \\
        --exec -- python3 examples/python/train_ddp.py --steps 100

It checkpoints itself (rank 0, every --ckpt-every steps) into $DT_EXPERIMENT_DIR when dt runs it,
else into --ckpt-dir, and resumes from there after a restart.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN_VARIABLES = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "DT_COORDINATOR", "DT_RUN_ID", "DT_EXPERIMENT_DIR", "DT_LATEST_CHECKPOINT",
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(HERE, "..", "..", "data", "tinyshakespeare.txt"))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per rank per step")
    p.add_argument("--context", type=int, default=8, help="characters the model sees")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint every N steps (0: never)")
    p.add_argument("--ckpt-dir", default="", help="where checkpoints go (default: $DT_EXPERIMENT_DIR, else ./ckpt)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (tests)")
    p.add_argument("--env-out", default="", help="write each rank's torchrun variables to DIR/env-rank-R.json")
    p.add_argument("--losses-out", default="", help="rank 0 writes 'step loss' lines here")
    p.add_argument("--fail-rank", type=int, default=-1, help="tests: this rank raises ValueError ...")
    p.add_argument("--fail-at-step", type=int, default=-1, help="... at this step")
    p.add_argument("--fail-leaves-child", action="store_true",
                   help="tests: ... after starting a child that ignores SIGTERM and outlives it (as a logging "
                        "service still flushing might)")
    return p.parse_args()


class CharModel(nn.Module):
    def __init__(self, vocab, context, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.mlp = nn.Sequential(nn.Linear(16 * context, width), nn.Tanh(), nn.Linear(width, vocab))

    def forward(self, x):
        return self.mlp(self.embed(x).flatten(1))


def load_text(path):
    """The characters of `path` as a tensor of indices, and the vocabulary size."""
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(chars)


def batch(data, args, step, rank):
    """The same batch for the same (seed, step, rank), whatever ran before: exact resume."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    starts = torch.randint(0, len(data) - args.context - 1, (args.batch_size,), generator=g)
    x = torch.stack([data[s:s + args.context] for s in starts])
    y = torch.stack([data[s + args.context] for s in starts])
    return x, y


# The last all-reduced loss, kept referenced until the next step replaces it. torch 1.13: when
# Python drops a tensor that Gloo's worker thread still holds, that thread frees it later and needs
# the GIL to do so; if DDP's process group is being destroyed at that moment by a thread holding the
# GIL (the end of the script), the destructor's join and the worker wait on each other forever.
_last_reduced = [None]


def train_step(model, opt, data, args, step, rank, world):
    """One DDP step; returns the loss averaged over the ranks."""
    x, y = batch(data, args, step, rank)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    reduced = loss.detach().clone()
    dist.all_reduce(reduced)
    _last_reduced[0] = reduced
    return reduced.item() / world


def checkpoint_path(args):
    base = args.ckpt_dir or os.environ.get("DT_EXPERIMENT_DIR") or os.path.join(os.getcwd(), "ckpt")
    return os.path.join(base, "train_ddp.pt")


@record
def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if args.env_out:
        os.makedirs(args.env_out, exist_ok=True)
        seen = {k: os.environ.get(k) for k in TORCHRUN_VARIABLES}
        seen["pid"] = os.getpid()
        seen["token_in_environment"] = bool(os.environ.get("DT_RUN_TOKEN"))
        # Whole or not at all: a reader polling for the file must never see half of it.
        path = os.path.join(args.env_out, f"env-rank-{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(seen, f)
        os.replace(path + ".tmp", path)
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE

    data, vocab = load_text(args.data)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(CharModel(vocab, args.context))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 0
    path = checkpoint_path(args)
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}: resumed from step {start} ({path})", flush=True)

    losses = open(args.losses_out, "a") if args.losses_out and rank == 0 else None
    for step in range(start + 1, args.steps + 1):
        if rank == args.fail_rank and step == args.fail_at_step:
            if args.fail_leaves_child:
                subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 600"])
            raise ValueError(f"injected failure at step {step}")
        mean = train_step(model, opt, data, args, step, rank, world)
        if rank == 0:
            print(f"step {step} loss {mean:.6f}", flush=True)
            if losses:
                losses.write(f"{step} {mean:.6f}\n")
                losses.flush()
        if args.ckpt_every and step % args.ckpt_every == 0 and rank == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)


if __name__ == "__main__":
    sys.exit(main())
