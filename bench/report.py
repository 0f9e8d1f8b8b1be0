#!/usr/bin/python3
"""Collects benchmark results (JSON lines) into build/bench/results.json and docs/benchmarks.md."""
import datetime
import json
import os
import platform
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
lines_file, json_file, md_file, mode = sys.argv[1:5]
results = [json.loads(l) for l in open(lines_file) if l.strip()]
json.dump([{k: r.get(k) for k in ("name", "value", "unit", "anchor", "anchor_value", "ratio", "goal", "met")}
           for r in results], open(json_file, "w"), indent=1)


def cpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    return "%s, %d cores" % (model, os.cpu_count())


def fmt(v):
    if v is None:
        return ""
    if abs(v) >= 1000:
        return "{:,.0f}".format(v)
    return "%.4g" % v


machine = cpu()
date = datetime.date.today().isoformat()
with open(md_file, "w") as f:
    f.write("# dt benchmarks\n\n")
    f.write("Written by `scripts/bench.sh%s` on %s (%s). Every figure is dt's, beside an anchor measured "
            "in the same run on the same machine; ratio = dt / anchor. Goals and whether this run met them "
            "are in the last columns. These machines are noisy: compare ratios, not absolute numbers.\n\n"
            % (" --quick" if mode == "quick" else "", date, machine))
    f.write("| what | dt | anchor | anchor figure | ratio | goal | met | machine | date |\n")
    f.write("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    for r in results:
        met = {True: "yes", False: "**no**", None: ""}[r.get("met")]
        f.write("| %s | %s %s | %s | %s | %.3f | %s | %s | %s | %s |\n" % (
            r["name"], fmt(r["value"]), r["unit"], r["anchor"], fmt(r["anchor_value"]), r.get("ratio") or 0,
            r.get("goal", ""), met, machine, date))
    f.write("\nHow each is measured: see the comment at the top of each program in `bench/` "
            "(`bench_store.cc`, `bench_scale.cc`, `bench_checkpoint.cc`, `bench_metrics.cc`, `trainer_bench.py`).\n")
    findings = os.path.join(os.path.dirname(os.path.abspath(__file__)), "findings.md")
    if os.path.exists(findings):
        with open(findings) as g:
            f.write("\n" + g.read())
print("wrote %s and %s (%d results)" % (json_file, md_file, len(results)))
