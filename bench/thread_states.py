#!/usr/bin/env python3
"""Samples what every thread of a process is doing, from /proc, for a diagnosis that a CUDA trace
cannot give: a host thread that is missing from the trace is either running code the profiler
does not record, or blocked (and then in which system call and kernel function).

    thread_states.py NAME OUT [PERIOD_MS]

Waits for a process whose command name is NAME, samples each of its threads every PERIOD_MS (1 by
default; a sample of dttrainer's 100 threads itself takes about 5 ms) until it exits, then waits
for the next one, until it is stopped. OUT gets a `# pid` line per process, a `# tid` line naming
each thread, and one line per sample: `unix_time tid:state:syscall:wchan:utime+stime:waited_us ...`
(state R running, S sleeping, D in I/O; the system call number from /proc/TID/syscall, `running` while in user space; CPU ticks so far;
microseconds spent runnable but waiting for a CPU so far, from /proc/TID/schedstat).
To stay small it names only the threads that changed since the last sample, and every thread
every 100 ms (those lines say `all`).
"""
import os
import sys
import time


def find(name):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/comm" % pid) as f:
                    if f.read().strip() == name:
                        return pid
            except OSError:
                pass
    return None


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def sample(pid):
    states = []
    for tid in sorted(os.listdir("/proc/%s/task" % pid), key=int):
        stat = read("/proc/%s/task/%s/stat" % (pid, tid))
        if not stat:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        syscall = read("/proc/%s/task/%s/syscall" % (pid, tid)).split(" ", 1)[0].strip() or "?"
        wchan = read("/proc/%s/task/%s/wchan" % (pid, tid)).strip() or "-"
        sched = read("/proc/%s/task/%s/schedstat" % (pid, tid)).split()
        waited = int(sched[1]) // 1000 if len(sched) > 1 else -1
        states.append((tid, fields[0], syscall, wchan, int(fields[11]) + int(fields[12]), waited))
    return states


def follow(pid, name, f, period):
    f.write("# pid %s (%s)\n" % (pid, name))
    last, full_at, named = {}, 0.0, set()
    while os.path.exists("/proc/%s/task" % pid):
        try:
            now = sample(pid)
        except OSError:
            break
        t = time.time()
        for tid in [x[0] for x in now if x[0] not in named]:
            named.add(tid)
            f.write("# tid %s %s\n" % (tid, read("/proc/%s/task/%s/comm" % (pid, tid)).strip()))
        whole = t - full_at >= 0.1
        changed = [x for x in now if whole or last.get(x[0]) != x[1:4]]
        if changed:
            f.write("%.6f%s %s\n" % (t, " all" if whole else "", " ".join("%s:%s:%s:%s:%d:%d" % x for x in changed)))
        if whole:
            full_at = t
        last = {x[0]: x[1:4] for x in now}
        time.sleep(period)
    f.flush()


def main():
    name, out = sys.argv[1], sys.argv[2]
    period = float(sys.argv[3]) / 1e3 if len(sys.argv) > 3 else 1e-3
    seen = set()
    with open(out, "w") as f:
        while True:
            pid = find(name)
            if pid is None or pid in seen:
                time.sleep(0.02)
                continue
            seen.add(pid)
            follow(pid, name, f, period)


if __name__ == "__main__":
    sys.exit(main())
