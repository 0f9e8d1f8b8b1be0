#!/usr/bin/env bash
# Chaos rounds against the real system (dtcoord, local runs, Prometheus, the strict W&B test
# server): one injected fault per round, then the checks a user relies on. See scripts/chaos.py.
#
#   scripts/chaos.sh [ROUNDS] [--seed S] [--faults a,b,...] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --chaos
[[ -x build/bin/dtcoord && -x build/bin/dttrainer ]] || scripts/build.sh
exec /usr/bin/python3 scripts/chaos.py "$@"
