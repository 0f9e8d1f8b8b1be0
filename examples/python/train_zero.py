#!/usr/bin/env python3
"""The model of train_ddp.py with its Adam state sharded across the ranks
(torch.distributed.optim.ZeroRedundancyOptimizer: each rank holds the state of its part of the
parameters), checkpointed in sharded dt rounds: every rank saves its own optimizer shard, rank 0
also the model, and the coordinator publishes them together in one step-S with one manifest.json.

    dtctl submit --name zero --save-dir /tmp/runs --nproc-per-node 2 --max-restarts 2 \\
        --exec -- python3 examples/python/train_zero.py --steps 100

A sharded checkpoint is resumed at the world size that wrote it (manifest.json's world_size):
each rank loads the shard it wrote.
"""
import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import dt
from train_ddp import CharModel, load_text, train_step
from train_dt import options  # train_dt.py's options, and the tests' kill switch below


def parse_args():
    p = options(__doc__)
    p.add_argument("--kill-rank", type=int, default=-1, help="tests: this rank kills itself (SIGKILL) ...")
    p.add_argument("--kill-at-step", type=int, default=-1, help="... before this step, in the first generation")
    return p.parse_args()


def load(latest, model, opt, rank, world):
    """Each rank loads the model and the optimizer shard it wrote; returns the step."""
    dt.verify_checkpoint(latest)  # every shard's size and SHA-256, as its rank recorded them
    with open(os.path.join(latest, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("world_size") != world:
        raise SystemExit(f"{latest} was written by {manifest.get('world_size')} ranks; this run has {world}: "
                         "a ZeroRedundancyOptimizer shard loads only at the world size that wrote it")
    state = torch.load(os.path.join(latest, "model.pt"))
    model.module.load_state_dict(state["model"])
    opt.optim.load_state_dict(torch.load(os.path.join(latest, f"optim-{rank}.pt")))
    return state["step"]


@record
def main():
    args = parse_args()
    under_dt = dt.init()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data, vocab = load_text(args.data)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(CharModel(vocab, args.context))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    start = 0
    latest = dt.latest_checkpoint()
    if latest:
        start = load(latest, model, opt, rank, world)
        print(f"rank {rank}: resumed from step {start} ({latest})", flush=True)
    print(f"rank {rank}: under dt: {under_dt}", flush=True)

    def save(step):
        with dt.checkpoint(step, sharded=True) as ck:
            torch.save(opt.optim.state_dict(), ck.file(f"optim-{rank}.pt"))  # this rank's shard only
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "step": step}, ck.file("model.pt"))
            # Every rank describes the same layout (the coordinator refuses two that differ).
            ck.layout = {"optimizer": "ZeroRedundancyOptimizer", "shards": world, "shard_file": "optim-{rank}.pt"}
        if rank == 0:
            print(f"checkpoint at step {step}: {ck.path} ({ck.bytes} bytes)", flush=True)

    for step in range(start + 1, args.steps + 1):
        if rank == args.kill_rank and step == args.kill_at_step and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            os.kill(os.getpid(), signal.SIGKILL)  # as `kill -9` from outside would
        loss = train_step(model, opt, data, args, step, rank, world)
        dt.log({"loss": loss}, step)
        if rank == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
        saved = args.ckpt_every and step % args.ckpt_every == 0
        if saved:
            save(step)
        if dt.should_stop(step):
            if not saved:
                save(step)
            dist.destroy_process_group()
            return 0
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dt.barrier("training-done")
    dist.destroy_process_group()
    if rank == 0:
        flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
        print(f"done: {args.steps} steps, parameters sha256 {digest}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
