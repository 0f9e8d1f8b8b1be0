#!/usr/bin/env bash
# Installs every Debian package dt's build, tests and demo need. Idempotent: packages that are
# already installed are skipped, and apt-get update runs at most once per call.
#
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --bench    also what bench/ needs beside the tests (hyperfine, gdb)
#   scripts/setup.sh --chaos    also what scripts/chaos.sh needs (bindfs: a save dir that stalls)
set -euo pipefail

packages=(
  # toolchain (clang-format: scripts/test.sh checks the house style)
  build-essential cmake ninja-build ccache pkg-config git ca-certificates procps psmisc clang-format
  # clang with libFuzzer and the sanitizer runtimes: the fuzz targets and the thread-safety check
  clang libclang-rt-14-dev
  # RPC and core libraries
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libabsl-dev
  libsqlite3-dev libssl-dev libcurl4-openssl-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
  prometheus-cpp-dev zlib1g-dev libre2-dev
  # LibTorch (CPU, c10d + Gloo), Gloo headers, and OpenBLAS so libblas.so.3 is not the reference BLAS
  libtorch-dev libgloo-dev libopenblas0-openmp
  # TLS certificates for the TLS test
  openssl
  # tests
  libgtest-dev libgmock-dev googletest libbenchmark-dev python3 curl
  # the web console's browser test: headless Chromium driven through chromedriver (WebDriver)
  chromium chromium-driver
  # users' own programs under dtrun: PyTorch (Gloo) scripts, and the dt Python module's gRPC
  python3-torch python3-grpcio python3-protobuf
  # real servers the integration tests run
  slurmctld slurmd slurm-client munge prometheus
  # stacks of a hung run's processes: eu-stack (native frames; Python frames come from the
  # interpreter's own faulthandler)
  elfutils
)
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(hyperfine gdb) ;;  # gdb: the anchor of bench_capture
    --chaos) packages+=(bindfs) ;;         # a FUSE save dir whose daemon the stalled-save-dir round stops
    *) echo "setup: unknown option $arg (use --bench or --chaos)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
