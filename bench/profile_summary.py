#!/usr/bin/python3
"""Lays Chrome traces of training steps side by side (Kineto's format, as dttrainer's
--profile-trace and torch.profiler's export_chrome_trace write them on a GPU): per step, the
device's kernel time by kind, its busy share of the window, the kernel launches, copies and host
synchronisations, the longest idle gaps, and the kernels each side spends most on.

  profile_summary.py --steps 3 dttrainer=dt.json eager=py.json > summary.txt

Why: a throughput ratio says that dttrainer is slower than PyTorch's eager loop, not where. The
same steps traced on both sides say whether the gap is in the kernels (a different attention or
optimizer kernel), between them (the device idle while the host launches or waits), or in copies.
"""
import argparse
import collections
import json
import re
import sys

KINDS = [  # the first pattern found in a kernel's name wins
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_"),
    ("attention/softmax", r"softmax|flash|fmha|attention|masked_fill"),
    ("layernorm", r"layer_norm|LayerNorm"),
    ("optimizer (foreach)", r"multi_tensor|foreach|Adam"),
    ("reduce/norm", r"reduce|norm|sum_|Sum"),
    ("nccl", r"nccl"),
    ("copy/cast", r"copy|Copy|cast|to_"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|Gelu|tanh|mul|add|div"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union_length(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def host_call_during(by_cat, start, stop):
    """The host's CUDA call (or else operator) that overlaps most of the idle time [start, stop)."""
    best, name = 0.0, "-"
    for cat in ("cuda_runtime", "cuda_driver", "cpu_op"):
        for e in by_cat[cat]:
            overlap = min(stop, e["ts"] + e["dur"]) - max(start, e["ts"])
            if overlap > best:
                best, name = overlap, e["name"]
        if best > 0.5 * (stop - start):
            break
    return name


def summarize(events, steps):
    by_cat = collections.defaultdict(list)
    for e in events:
        by_cat[e.get("cat", "")].append(e)
    kernels = by_cat["kernel"]
    device = kernels + by_cat["gpu_memcpy"] + by_cat["gpu_memset"]
    s = {"steps": steps}
    if not device:
        s["error"] = "no device events (a trace without CUDA activity)"
        return s
    t0 = min(e["ts"] for e in device)
    t1 = max(e["ts"] + e["dur"] for e in device)
    s["span_ms"] = (t1 - t0) / 1e3 / steps
    s["busy"] = union_length([(e["ts"], e["ts"] + e["dur"]) for e in device]) / (t1 - t0)
    s["kernels"] = len(kernels) / steps
    s["kernel_ms"] = sum(e["dur"] for e in kernels) / 1e3 / steps
    kinds = collections.Counter()
    for e in kernels:
        kinds[kind_of(e["name"])] += e["dur"] / 1e3 / steps
    s["kinds"] = dict(kinds)
    copies = collections.defaultdict(lambda: [0, 0.0])
    for e in by_cat["gpu_memcpy"] + by_cat["gpu_memset"]:
        copies[e["name"]][0] += 1
        copies[e["name"]][1] += e["dur"] / 1e3
    s["copies"] = {k: (n / steps, ms / steps) for k, (n, ms) in copies.items()}
    runtime = collections.defaultdict(lambda: [0, 0.0])
    for e in by_cat["cuda_runtime"] + by_cat["cuda_driver"]:
        runtime[e["name"]][0] += 1
        runtime[e["name"]][1] += e["dur"] / 1e3
    s["runtime"] = {k: (n / steps, ms / steps) for k, (n, ms) in runtime.items()}
    top = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        top[e["name"]][0] += 1
        top[e["name"]][1] += e["dur"] / 1e3
    s["top"] = sorted(((ms / steps, n / steps, name) for name, (n, ms) in top.items()), reverse=True)[:25]
    ordered = sorted(device, key=lambda e: e["ts"])
    gaps, end, before = [], ordered[0]["ts"] + ordered[0]["dur"], ordered[0]["name"]
    for e in ordered[1:]:
        if e["ts"] - end > 20:
            gaps.append(((e["ts"] - end) / 1e3, before, e["name"], end))
        if e["ts"] + e["dur"] > end:
            end, before = e["ts"] + e["dur"], e["name"]
    s["gaps_ms"] = sum(g[0] for g in gaps) / steps
    s["gaps"] = len(gaps) / steps
    s["longest_gaps"] = [g + (host_call_during(by_cat, g[3], g[3] + 1e3 * g[0]),) for g in sorted(gaps, reverse=True)[:12]]
    s["cpu_ops"] = len(by_cat["cpu_op"]) / steps
    return s


def short(name, width=100):
    return name if len(name) <= width else name[:width - 3] + "..."


def report(summaries, out):
    labels = list(summaries)
    w = max(22, max(len(label) for label in labels) + 2)
    row = lambda title, values: out.write("%-34s" % title + "".join("%*s" % (w, v) for v in values) + "\n")
    out.write("per step, over %s steps\n" % ", ".join("%s: %d" % (k, s["steps"]) for k, s in summaries.items()))
    row("", labels)
    for label, s in summaries.items():
        if "error" in s:
            out.write("%s: %s\n" % (label, s["error"]))
    ok = {k: s for k, s in summaries.items() if "error" not in s}
    if not ok:
        return
    cols = lambda f: [f(summaries[k]) if k in ok else "-" for k in labels]
    row("device window (first to last op)", cols(lambda s: "%.2f ms" % s["span_ms"]))
    row("device busy share", cols(lambda s: "%.1f%%" % (100 * s["busy"])))
    row("kernel time", cols(lambda s: "%.2f ms" % s["kernel_ms"]))
    row("kernels", cols(lambda s: "%.0f" % s["kernels"]))
    row("idle gaps over 20 us", cols(lambda s: "%.0f, %.2f ms" % (s["gaps"], s["gaps_ms"])))
    row("host operators (cpu_op)", cols(lambda s: "%.0f" % s["cpu_ops"]))
    out.write("\nkernel time by kind (ms per step)\n")
    for kind in [k for k, _ in KINDS] + ["other"]:
        row("  " + kind, cols(lambda s: "%.2f" % s["kinds"].get(kind, 0.0)))
    for title, key in (("copies and sets (count, ms per step)", "copies"),
                       ("CUDA runtime calls (count, ms per step)", "runtime")):
        out.write("\n%s\n" % title)
        names = sorted(set().union(*(s[key] for s in ok.values())))
        for name in names:
            row("  " + short(name, 32), cols(lambda s: "%.1f, %.2f" % s[key].get(name, (0, 0.0))))
    for label, s in ok.items():
        out.write("\n%s: kernels by time (ms per step, launches per step, name)\n" % label)
        for ms, n, name in s["top"]:
            out.write("  %8.3f %6.1f  %s\n" % (ms, n, short(name)))
        out.write("%s: longest idle gaps (ms, the host's call meanwhile: after -> before)\n" % label)
        for ms, before, after, _, host in s["longest_gaps"]:
            out.write("  %8.3f  [%s] %s  ->  %s\n" % (ms, short(host, 40), short(before, 50), short(after, 50)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="the steps each trace holds")
    ap.add_argument("traces", nargs="+", help="LABEL=PATH")
    args = ap.parse_args()
    summaries = {}
    for item in args.traces:
        label, _, path = item.partition("=")
        if not path:
            ap.error("%r: want LABEL=PATH" % item)
        try:
            summaries[label] = summarize(load(path), args.steps)
        except (OSError, ValueError, KeyError) as e:
            summaries[label] = {"steps": args.steps, "error": "%s: %s" % (path, e)}
    report(summaries, sys.stdout)


if __name__ == "__main__":
    main()
