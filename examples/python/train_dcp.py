#!/usr/bin/env python3
"""torch.distributed.checkpoint (DCP, torch >= 2.0) inside dt's sharded rounds: the state is
sharded across the ranks as DTensors (each rank holds its rows of a weight matrix and of Adam's
two moments, as tensor or fully sharded parallelism leaves them), `dcp.save` writes each rank's
shards into the round's directory, and every rank claims the files it wrote; the coordinator
publishes them together in one step-S with one manifest.json, or not at all. A restarted group
loads the latest round with `dcp.load` and trains on exactly as an uninterrupted run.

    dtctl submit --name dcp --save-dir /tmp/runs --nproc-per-node 2 --max-restarts 2 \\
        --exec -- python3 examples/python/train_dcp.py --steps 100

The model is a row-sharded linear map fitted by least squares to a fixed random target: small
enough to run on CPUs over Gloo, and every rank's shard is its own, as in a real sharded model.
"""
import argparse
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import DTensor, Shard

import dt


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=10, help="a sharded round every N steps (0: none)")
    p.add_argument("--rows", type=int, default=64, help="the weight's rows (divided among the ranks)")
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--kill-rank", type=int, default=-1, help="tests: this rank kills itself (SIGKILL) ...")
    p.add_argument("--kill-at-step", type=int, default=-1, help="... before this step, in the first generation")
    return p.parse_args()


class ShardedAdam:
    """This rank's rows of W and their Adam moments (betas 0.9 and 0.999, no weight decay)."""

    def __init__(self, rows, cols, rank, seed):
        self.w = torch.zeros(rows, cols, dtype=torch.float64)
        self.m = torch.zeros_like(self.w)
        self.v = torch.zeros_like(self.w)
        g = torch.Generator().manual_seed(seed)
        target = torch.randn(rows * (rank + 1), cols, generator=g, dtype=torch.float64)
        self.target = target[rows * rank:]  # this rank's rows of the one global target

    def step(self, x, step, lr):
        """One least-squares step on the batch x; returns this rank's share of the loss."""
        err = x @ self.w.T - x @ self.target.T
        grad = 2 * err.T @ x / x.numel()
        self.m.mul_(0.9).add_(grad, alpha=0.1)
        self.v.mul_(0.999).addcmul_(grad, grad, value=0.001)
        m_hat, v_hat = self.m / (1 - 0.9 ** step), self.v / (1 - 0.999 ** step)
        self.w.sub_(lr * m_hat / (v_hat.sqrt() + 1e-8))
        return (err ** 2).sum() / x.numel()

    def state(self, mesh, step):
        """The DCP state dict: the three tensors as DTensors sharded by rows over the mesh."""
        shard = lambda t: DTensor.from_local(t, mesh, [Shard(0)], run_check=False)
        return {"w": shard(self.w), "exp_avg": shard(self.m), "exp_avg_sq": shard(self.v), "step": step}

    def load(self, state):
        for name, t in (("w", self.w), ("exp_avg", self.m), ("exp_avg_sq", self.v)):
            t.copy_(state[name].to_local())
        return state["step"]


@record
def main():
    args = parse_args()
    dt.init()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.rows % world:
        raise SystemExit(f"--rows {args.rows} does not divide among {world} ranks")
    mesh = init_device_mesh("cpu", (world,))
    model = ShardedAdam(args.rows // world, args.cols, rank, args.seed)
    start = 0
    latest = dt.latest_checkpoint()
    if latest:
        dt.verify_checkpoint(latest)  # every shard's size and SHA-256, as its rank recorded them
        state = model.state(mesh, 0)
        dcp.load(state, checkpoint_id=latest)  # into this rank's shards, in place
        start = model.load(state)
        print(f"rank {rank}: resumed from step {start} ({latest})", flush=True)

    def save(step):
        with dt.checkpoint(step, sharded=True) as ck:
            dcp.save(model.state(mesh, step), checkpoint_id=ck.dir)
            ck.claim(f"__{rank}_*.distcp")  # the shards this rank wrote
            if rank == 0:
                ck.claim(".metadata")  # DCP's coordinator writes the index of every shard
            ck.layout = {"format": "torch.distributed.checkpoint", "mesh": [world], "placements": ["Shard(0)"]}
        if rank == 0:
            print(f"checkpoint at step {step}: {ck.path} ({ck.bytes} bytes)", flush=True)

    for step in range(start + 1, args.steps + 1):
        if rank == args.kill_rank and step == args.kill_at_step and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            os.kill(os.getpid(), signal.SIGKILL)  # as `kill -9` from outside would
        x = torch.randn(args.batch, args.cols, generator=torch.Generator().manual_seed(args.seed + step),
                        dtype=torch.float64)
        loss = model.step(x, step, args.lr)
        dist.all_reduce(loss)
        dt.log({"loss": loss.item()}, step)
        if rank == 0:
            print(f"step {step} loss {loss.item():.9f}", flush=True)
        if args.ckpt_every and step % args.ckpt_every == 0:
            save(step)
    shards = [torch.empty_like(model.w) for _ in range(world)]
    dist.all_gather(shards, model.w)
    dist.destroy_process_group()
    if rank == 0:
        digest = hashlib.sha256(torch.cat(shards).numpy().tobytes()).hexdigest()
        print(f"done: {args.steps} steps, parameters sha256 {digest}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
