#!/usr/bin/python3
"""Appends "<generation> <unix time> <pid>" to a file every 0.1 s until stopped: which generation of
a run is still writing, and when. No torch: it starts at once.

  writer.py OUT
"""
import os
import sys
import time

generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")


def write_batches(out):
    while True:
        with open(out, "a") as f:
            f.write("%s %.3f %d\n" % (generation, time.time(), os.getpid()))
        time.sleep(0.1)


write_batches(sys.argv[1])
