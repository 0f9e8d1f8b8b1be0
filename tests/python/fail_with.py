#!/usr/bin/python3
"""A program under dtrun that fails in a way that once broke dt's report (no torch: it starts fast).
Rank 1 fails; rank 0 waits to be stopped.

  fail_with.py huge-error-file BYTES   rank 1 writes TORCHELASTIC_ERROR_FILE with a ValueError whose
                                       message is BYTES long, then exits 1
  fail_with.py invalid-utf8            rank 1 prints bytes that are not UTF-8, then raises ValueError
                                       with such bytes in its message (no error file)
"""
import json
import os
import sys
import time


def main():
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    if rank != 1:
        time.sleep(600)
        return
    if mode == "huge-error-file":
        size = int(sys.argv[2])
        message = "ValueError: START" + "x" * size + "END"
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
            json.dump({"message": {"message": message,
                                   "extraInfo": {"py_callstack": "Traceback (most recent call last):\n"
                                                 "  File \"fail_with.py\", line 30, in main\n" + message}}}, f)
        sys.exit(1)
    if mode == "invalid-utf8":
        sys.stdout.buffer.write(b"loading caf\xc3 \xff\xfe data\n")
        sys.stdout.flush()
        raise ValueError(b"bad bytes \xff\xfe in record".decode("utf-8", "surrogateescape"))
    sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
