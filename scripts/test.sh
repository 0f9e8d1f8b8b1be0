#!/usr/bin/env bash
# The test command: installs what the build and tests need (scripts/setup.sh), builds dt
# (Release, every core; scripts/build.sh), runs the whole suite with ctest, and exits non-zero on
# any failure.
#
#   scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L unit
#   scripts/test.sh --sanitize KIND [ctest arguments...]
#       KIND is address, undefined or address,undefined: builds the parts without LibTorch with that
#       sanitizer in build-<KIND>/ and runs their unit and integration tests; any report fails the
#       test (halt_on_error). ThreadSanitizer is not offered (Debian's Abseil is not built with it).
#   scripts/test.sh --fuzz [ctest arguments...]
#       clang, in build-fuzz/: the parts without LibTorch under ASan+UBSan with -Werror=thread-safety
#       (the build fails on a broken lock contract), their unit and integration tests, and a short,
#       repeatable run of each fuzz target (label fuzz; scripts/fuzz.sh fuzzes for longer).
#       .ci/run runs it after the suite: about 6 minutes of build on 2 cores and 1.5 of tests.
#
# The sources must be formatted (scripts/format.sh --check; scripts/format.sh fixes them), and no
# file may refer outside the clone (scripts/check-self-contained.sh).
#
# Labels: unit (no network), integration (gRPC on loopback), e2e (real trainer processes, Gloo,
# W&B test server, Prometheus), slurm (a real single-machine Slurm; needs root), slurm-soak (the
# Slurm root-cause test 20 times in a row; only with -L slurm-soak), chaos (every fault of
# scripts/chaos.py, about 3 minutes; only with -L chaos; two of them run in e2e).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--sanitize" || "${1:-}" == "--fuzz" ]]; then
  if [[ "$1" == "--fuzz" ]]; then
    shift
    scripts/build.sh --fuzz
    cd build-fuzz
    labels='unit|integration|fuzz'
  else
    kind="${2:?--sanitize needs address, undefined or address,undefined}"
    shift 2
    scripts/build.sh --sanitize "$kind"
    cd "build-${kind/,/-}"
    labels='unit|integration'
  fi
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  # gRPC, protobuf and Abseil come from Debian, uninstrumented: leaks they hold until exit are theirs.
  export LSAN_OPTIONS="suppressions=$PWD/../tests/lsan.supp:print_suppressions=0"
  ctest --output-on-failure --no-tests=error -j "$(nproc)" -L "$labels" "$@"
  exit
fi

scripts/build.sh
scripts/format.sh --check
scripts/check-self-contained.sh
cd build
# The soak and chaos labels run only when asked for (scripts/test.sh -L slurm-soak, -L chaos).
label_args=(-LE 'slurm-soak|chaos')
for a in "$@"; do [[ "$a" == -L || "$a" == -L* || "$a" == --label-regex* ]] && label_args=(); done
ctest --output-on-failure --no-tests=error -j "$(nproc)" "${label_args[@]}" "$@"
