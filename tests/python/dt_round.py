#!/usr/bin/python3
"""A checkpoint round of the dt module that must not commit, for the tests. Every rank prints what
its round came to ("round: <outcome>") and exits 0.

  dt_round.py non-writer-raises    rank 1 raises inside its `with dt.checkpoint(1)` block
  dt_round.py writer-saves-subdir  the writer saves a subdirectory, which a round cannot hold
  dt_round.py writer-finds-round-aborted
                                   rank 1 raises at once; the writer leaves its block only once
                                   that abort has removed the round's directory under it
  dt_round.py writer-saves-into-aborted-round
                                   rank 1 raises at once; the writer saves only after that abort
                                   has removed the round's directory
  dt_round.py sharded-duplicate    a sharded round where both ranks claim state.bin
  dt_round.py sharded-rank-raises  a sharded round where rank 1 raises after saving its shard
  dt_round.py sharded-unclaimed    a sharded round where rank 1 saves a file it does not claim
  dt_round.py sharded-subdir       a sharded round where rank 1 makes a subdirectory
  dt_round.py sharded-symlink      a sharded round where rank 1's claimed file is a symbolic link
  dt_round.py sharded-rank-dies    a sharded round where rank 1 is killed (SIGKILL) after saving
  dt_round.py sharded-claims       a sharded round that commits: each rank writes files as a library
                                   would (torch.distributed.checkpoint's names) and claims them by
                                   pattern, rank 0 also ".metadata"; prints the published manifest
"""
import json
import os
import signal
import sys
import time

import dt


def main():
    mode = sys.argv[1]
    dt.init()
    report(lambda: (sharded if mode.startswith("sharded-") else single_writer)(mode))


def report(round_):
    """Runs the round and prints what it came to, then what `latest` names."""
    try:
        round_()
        print("round: committed", flush=True)
    except ValueError as e:
        print("round: raised", e, flush=True)
    except dt.DtError as e:
        print("round: not committed:", e, flush=True)
    print("latest:", dt.latest_checkpoint(), flush=True)


def single_writer(mode):
    with dt.checkpoint(1) as ck:
        if ck.is_writer:
            if mode == "writer-saves-into-aborted-round":
                deadline = time.monotonic() + 60
                while os.path.exists(ck.dir) and time.monotonic() < deadline:
                    time.sleep(0.02)
            with open(os.path.join(ck.dir, "state.bin"), "wb") as f:
                f.write(b"x" * 1000)
            if mode == "writer-saves-subdir":
                os.mkdir(os.path.join(ck.dir, "nested"))
            if mode == "writer-finds-round-aborted":
                deadline = time.monotonic() + 60
                while os.path.exists(ck.dir) and time.monotonic() < deadline:
                    time.sleep(0.02)
        if mode != "writer-saves-subdir" and dt.rank() == 1:
            raise ValueError("a bad batch on rank 1")


def sharded(mode):
    rank = dt.rank()
    if mode == "sharded-claims":
        return sharded_claims(rank)
    with dt.checkpoint(1, sharded=True) as ck:
        name = "state.bin" if mode == "sharded-duplicate" else f"shard-{rank}.bin"
        with open(ck.file(name), "wb") as f:
            f.write(bytes([rank]) * 1000)
        if rank == 1 and mode == "sharded-unclaimed":
            with open(os.path.join(ck.dir, "forgotten.bin"), "wb") as f:
                f.write(b"y")
        if rank == 1 and mode == "sharded-subdir":
            os.mkdir(os.path.join(ck.dir, "nested"))
        if rank == 1 and mode == "sharded-symlink":
            os.symlink(f"shard-{rank}.bin", ck.file("link.bin"))
        if rank == 1 and mode == "sharded-rank-raises":
            raise ValueError("a bad batch on rank 1")
        if rank == 1 and mode == "sharded-rank-dies":
            os.kill(os.getpid(), signal.SIGKILL)



def sharded_claims(rank):
    with dt.checkpoint(1, sharded=True) as ck:
        for part in range(2):
            with open(os.path.join(ck.dir, f"__{rank}_{part}.distcp"), "wb") as f:
                f.write(bytes([rank, part]) * 100)
        if rank == 0:
            with open(os.path.join(ck.dir, ".metadata"), "wb") as f:
                f.write(b"plan")
            ck.claim(".metadata")
        ck.claim(f"__{rank}_*.distcp")
        try:
            ck.claim(f"__{rank}_*.nothing")
        except dt.DtError as e:
            print("claim refused:", e, flush=True)
    dt.barrier("published")
    if rank == 0:
        with open(os.path.join(ck.path, "manifest.json")) as f:
            files = sorted((entry["name"], entry["rank"]) for entry in json.load(f)["files"])
        print("published:", files, flush=True)
        dt.verify_checkpoint(ck.path)
        print("verified", flush=True)


if __name__ == "__main__":
    main()
