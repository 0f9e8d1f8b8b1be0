#!/usr/bin/env python3
"""The model of train_ddp.py, using the dt module: metrics through dt.log (Prometheus, W&B,
`dtctl metrics`, the hang watchdog) and checkpoint rounds through dt.checkpoint (one writer,
committed by the coordinator with their sizes and SHA-256, verified and resumed from dt.latest_checkpoint()).

    dtctl submit --name dt-ddp --save-dir /tmp/runs --nproc-per-node 2 --max-restarts 2 \\
        --exec -- python3 examples/python/train_dt.py --steps 100

Without dt (torchrun, or bare with RANK/WORLD_SIZE/MASTER_*) it runs the same, checkpointing
into ./checkpoints.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

import dt
from train_ddp import HERE, CharModel, load_text, train_step


def parse_args():
    return options(__doc__).parse_args()


def options(doc):
    """The options of this script (train_zero.py adds its own)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(HERE, "..", "..", "data", "tinyshakespeare.txt"))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--context", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0)
    return p


@record
def main():
    args = parse_args()
    under_dt = dt.init()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data, vocab = load_text(args.data)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(CharModel(vocab, args.context))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 0
    latest = dt.latest_checkpoint()
    if latest:
        dt.verify_checkpoint(latest)  # sizes and SHA-256 against what the writer recorded
        state = torch.load(os.path.join(latest, "state.pt"))
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}: resumed from step {start} ({latest})", flush=True)
    print(f"rank {rank}: under dt: {under_dt}", flush=True)
    def save(step):
        with dt.checkpoint(step) as ck:
            if ck.is_writer:
                torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step},
                           os.path.join(ck.dir, "state.pt"))
        if rank == 0:
            print(f"checkpoint at step {step}: {ck.path}", flush=True)

    for step in range(start + 1, args.steps + 1):
        loss = train_step(model, opt, data, args, step, rank, world)
        dt.log({"loss": loss, "lr": args.lr}, step)
        if rank == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
        saved = args.ckpt_every and step % args.ckpt_every == 0
        if saved:
            save(step)
        # Slurm's SIGUSR2 (a preemption, the time limit): every rank stops after the same step,
        # saved; exiting 0 then makes dtrun leave the ranks as preempted and the job is requeued.
        if dt.should_stop(step):
            if not saved:
                save(step)
            print(f"rank {rank}: stopped at step {step} for the scheduler", flush=True)
            dist.destroy_process_group()
            return 0
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dt.barrier("training-done")
    dist.destroy_process_group()
    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)


if __name__ == "__main__":
    sys.exit(main())
