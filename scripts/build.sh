#!/usr/bin/env bash
# Configures and builds dt (Release, every core) in build/, the way the tests and the Docker images
# do. Installs Debian packages first (scripts/setup.sh).
#
#   scripts/build.sh [--install PREFIX] [--torch-dir DIR] [--target T]... [--sanitize KIND] [--fuzz]
#     --install PREFIX   also `cmake --install` the binaries, the sbatch template and deploy/ files
#     --torch-dir DIR    build against another LibTorch (e.g. a CUDA one, for NCCL): its Torch_DIR
#     --target T         build only these targets (default: everything, tests included)
#     --sanitize KIND    address, undefined or address,undefined: the parts without LibTorch
#                        (coordinator, client, dtctl and their tests) in build-<KIND>/
#     --fuzz             clang, in build-fuzz/: the parts without LibTorch under ASan+UBSan with
#                        libFuzzer's instrumentation and -Werror=thread-safety (scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=""
build_dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) prefix="$2"; shift 2 ;;
    --torch-dir) cmake_args+=("-DTorch_DIR=$2"); shift 2 ;;
    --target) targets+=(--target "$2"); shift 2 ;;
    --sanitize)
      build_dir="build-${2/,/-}"
      cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDT_SANITIZE="$2" -DDT_BUILD_TRAINER=OFF -DDT_BUILD_BENCH=OFF)
      shift 2 ;;
    --fuzz)
      build_dir=build-fuzz
      export CC=clang CXX=clang++
      cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDT_SANITIZE=address,undefined -DDT_FUZZ=ON -DDT_THREAD_SAFETY=ON
                  -DDT_BUILD_TRAINER=OFF -DDT_BUILD_BENCH=OFF)
      shift ;;
    *) echo "build.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh

# ccache keeps rebuilds cheap across runs on the same machine.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/dt-ccache}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"

cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}"
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
if [[ -n "$prefix" ]]; then
  cmake --install "$build_dir" --prefix "$prefix"
fi
