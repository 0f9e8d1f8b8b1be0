#!/usr/bin/python3
"""Two ranks under dtrun that print in turns (no torch: it starts fast): rank 0 prints "turn 0",
rank 1 prints "turn 1" once "turn 0" is in rank 0's log, and so on to "turn N-1". Each waits for the
other's line to reach the other's log, so the order of the lines in time is known. Both ranks also
print "both ranks print this" first.

  take_turns.py TURNS
"""
import os
import sys
import time


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:  # the other rank has not started yet
        return ""


def main():
    turns = int(sys.argv[1])
    rank = int(os.environ["RANK"])
    logs = os.path.join(os.environ["DT_EXPERIMENT_DIR"], "logs")
    other_log = os.path.join(logs, f"rank-{1 - rank}.log")
    print("both ranks print this", flush=True)
    for turn in range(turns):
        if turn % 2 != rank:
            continue
        if turn > 0:
            deadline = time.monotonic() + 60
            while f"turn {turn - 1}\n" not in read(other_log):
                if time.monotonic() > deadline:
                    sys.exit(f"turn {turn - 1} never reached {other_log}")
                time.sleep(0.02)
        print(f"turn {turn}", flush=True)


if __name__ == "__main__":
    main()
