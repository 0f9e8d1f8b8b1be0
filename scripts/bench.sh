#!/usr/bin/env bash
# Every benchmark, each beside its anchor in the same run: builds in Release, runs bench/, and
# writes docs/benchmarks.md and build/bench/results.json.
#
#   scripts/bench.sh [--quick]      --quick: fewer repeats and sizes (about 25 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
[[ "${1:-}" == "--quick" ]] && mode=quick
scripts/setup.sh --bench        # python3-torch: the Python anchors
scripts/build.sh
mkdir -p build/bench docs
export DT_BENCH_OUT="$PWD/build/bench/results.jsonl"
: > "$DT_BENCH_OUT"
[[ $mode == quick ]] && export DT_BENCH_QUICK=1
start=$(date +%s)
build/bin/bench_store
build/bin/bench_scale
build/bin/bench_checkpoint
build/bin/bench_sharded_checkpoint
build/bin/bench_metrics
build/bin/bench_capture
build/bin/bench_spawn
/usr/bin/python3 bench/trainer_bench.py
/usr/bin/python3 bench/report.py "$DT_BENCH_OUT" build/bench/results.json docs/benchmarks.md "$mode"
echo "benchmarks ($mode) took $(( $(date +%s) - start )) s"
