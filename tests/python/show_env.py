#!/usr/bin/python3
"""A program under dtrun that shows what environment each rank got (no torch: it starts fast).

  show_env.py OUT_DIR [NAME...]   each rank writes OUT_DIR/env-g<G>-rank-<R>.json with the named
                                  variables, every WANDB_* one and TORCHELASTIC_RESTART_COUNT.
                                  In generation 0, rank 1 then kills itself with SIGKILL (a
                                  restart follows); in later generations every rank exits 0.
"""
import json
import os
import signal
import sys
import time


def main():
    out, names = sys.argv[1], sys.argv[2:]
    rank = int(os.environ["RANK"])
    generation = int(os.environ["DT_GENERATION"])
    seen = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") or k in names}
    seen["TORCHELASTIC_RESTART_COUNT"] = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    seen["WANDB_DIR_EXISTS"] = os.path.isdir(os.environ.get("WANDB_DIR", "/nonexistent"))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"env-g{generation}-rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".tmp", path)  # whole or not at all
    print(f"rank {rank} generation {generation}: wrote {path}", flush=True)
    if generation == 0:
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)  # stopped with the group


if __name__ == "__main__":
    main()
