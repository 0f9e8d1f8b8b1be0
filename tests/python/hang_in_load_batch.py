#!/usr/bin/python3
"""A torchrun-style DDP script that hangs: rank 1 sleeps in load_batch while rank 0 waits for it in
an all_reduce. It never imports dt. The tests run it under dtctl submit --exec with --idle-timeout
and check that dt names load_batch (file and line) for rank 1 and the all_reduce for rank 0.

  hang_in_load_batch.py [--ready-file F]   (F is written once the process group is up)
"""
import argparse
import time

import torch
import torch.distributed as dist


def load_batch(rank):
    if rank == 1:
        time.sleep(3600)  # the hang: a stuck data loader
    return torch.ones(4)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", default="")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.ready_file:
        with open("%s.%d" % (args.ready_file, rank), "w") as f:
            f.write("ready\n")
    batch = load_batch(rank)
    dist.all_reduce(batch)
    print("reduced", batch.tolist(), flush=True)


if __name__ == "__main__":
    main()
