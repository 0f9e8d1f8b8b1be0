#!/usr/bin/env bash
# The test command: installs what the build and tests need, configures and builds dt (Release,
# every core), runs the whole suite with ctest, and exits non-zero on any failure.
#
#   scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/setup.sh

# ccache keeps rebuilds cheap across runs on the same machine.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/dt-ccache}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"

cd build
ctest --output-on-failure --no-tests=error -j "$jobs" "$@"
