#!/usr/bin/env bash
# The test command: installs what the build and tests need (scripts/setup.sh), builds dt
# (Release, every core; scripts/build.sh), runs the whole suite with ctest, and exits non-zero on
# any failure.
#
#   scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L unit
#
# Labels: unit (no network), integration (gRPC on loopback), e2e (real trainer processes, Gloo,
# W&B test server, Prometheus), slurm (a real single-machine Slurm; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh
cd build
ctest --output-on-failure --no-tests=error -j "$(nproc)" "$@"
