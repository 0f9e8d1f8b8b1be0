#!/usr/bin/env bash
# Builds and checks dt's CUDA build on the borrowed GPU machine (Ubuntu 24.04, the torch wheel, no
# network, no apt) with the Debian 12 packages that scripts/gpu-bundle.sh put in .gpu-bundle/.
# Run as root from the repository root, with .gpu-bundle carried:
#
#   scripts/gpu-check.sh                unpack the bundle into /opt/dtdeps; configure and build
#                                       dtcoord dtctl dttrainer trainer_cuda_e2e_test in build-gpu/
#                                       against the wheel's LibTorch; run the CUDA test; build dtrun
#                                       and dtrun_e2e_test, and run the DCP test on the wheel's
#                                       torch (DtrunTest.Dcp*); then bench/trainer_bench.py gpu with
#                                       Chrome traces of a few steps of each side laid together
#                                       (bench/profile_summary.py). Logs in $OUT.
#                                       DT_GPU_TEST_TIMEOUT (300 s), DT_GPU_BENCH_TIMEOUT (300 s),
#                                       DT_GPU_BENCH=0 (no benchmark), DT_GPU_JOBS (16),
#                                       DT_GPU_TEST_FILTER (a gtest filter), DT_GPU_BENCH_MODE (gpu;
#                                       gpu-ckpt: the checkpoint stall row alone), DT_GPU_DCP=0 (no
#                                       DCP test), DT_GPU_PROFILE=0 (no traces),
#                                       DT_GPU_BENCH_COMPILE=0 (no torch.compile row).
#   scripts/gpu-check.sh --local-check  on Debian 12, compiling nothing: unpack into
#                                       /tmp/dtdeps-test and configure with the same options
#                                       against Debian's LibTorch, every find confined to the bundle
#                                       and LibTorch; then look for /usr paths in the build files.
#
# The packages go into a prefix of their own, never into /: Debian 12's libraries must not replace
# Ubuntu's. dt's programs find them through their RPATH, protoc and pkgconf through wrappers.
# Nothing exports LD_LIBRARY_PATH, so python3 (torch) never loads them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
mode=${1:-gpu}
case $mode in
  gpu) P=/opt/dtdeps B=$PWD/build-gpu OUT=${OUT:-/tmp/gpu-check-out} ;;
  --local-check) P=/tmp/dtdeps-test B=/tmp/dtdeps-test-build OUT=/tmp/dtdeps-test-out TR=/tmp/dtdeps-test-sys ;;
  *) echo "usage: scripts/gpu-check.sh [--local-check]" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
arch=x86_64-linux-gnu
libpath=$P/usr/lib/$arch:$P/lib/$arch

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
results=()
phase() {  # phase NAME FUNCTION: runs it between two log lines; its status is the phase's
  local t0=$SECONDS rc
  log "=== $1: start"
  "$2"; rc=$?
  if ((rc)); then log "=== $1: FAILED (status $rc, $((SECONDS - t0)) s)"; results+=("$1 FAILED")
  else log "=== $1: ok ($((SECONDS - t0)) s)"; results+=("$1 ok"); fi
  return $rc
}

versions() {
  {
    date -u; grep PRETTY_NAME /etc/os-release; uname -r
    nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    echo "PATH=$PATH"; command -v cmake ninja g++ nvcc python3
    nvcc --version | tail -2; g++ --version | head -1; cmake --version | head -1; echo "ninja $(ninja --version)"
    python3 -c 'import torch, os
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())
print("NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")
print("cmake prefix", torch.utils.cmake_prefix_path)
print("wheel include/:", " ".join(sorted(os.listdir(os.path.join(os.path.dirname(torch.__file__), "include")))))'
  } 2>&1 | tee "$OUT/versions.txt"
  return 0
}

unpack() {
  local debs=(.gpu-bundle/debs/*.deb) d l t
  [[ -e ${debs[0]} ]] || { log "no .gpu-bundle/debs/*.deb: run scripts/gpu-bundle.sh and carry .gpu-bundle"; return 1; }
  # A warm machine's second run keeps the prefix: rewritten wrappers would rebuild much of build-gpu/.
  local stamp; stamp=$(du -b "${debs[@]}" | md5sum)
  if [[ $mode == gpu && -f $P/.bundle && $(cat "$P/.bundle") == "$stamp" ]]; then log "$P holds this bundle already"; return 0; fi
  rm -rf "$P" && mkdir -p "$P/wrap" || return
  for d in "${debs[@]}"; do dpkg -x "$d" "$P" || return; done
  log "${#debs[@]} packages unpacked into $P ($(du -sh "$P" | cut -f1))"
  # Absolute links (zlib1g-dev's libz.so -> /lib/...) to the same file in the prefix; a runtime
  # library left to the system (zlib1g) is the system's, under its soname.
  find "$P" -type l -lname '/*' | while read -r l; do
    t=$(readlink "$l")
    if [[ -e $P$t ]]; then ln -sfn "$P$t" "$l"; else ln -sfn "$(dirname "$t")/$(basename "$t" | sed -E 's/(\.so\.[0-9]+).*/\1/')" "$l"; fi
    [[ -e $l ]] && log "link $l -> $(readlink "$l")" || log "DANGLING link $l -> $(readlink "$l")"
  done
  # The CMake and pkg-config files name /usr (prefix=/usr, -I/usr/include, the "/usr move" guards
  # of the CMake configs): the prefix instead. (The bundle has no linker scripts.)
  grep -rlE '/usr' "$P" --include='*.pc' --include='*.cmake' |
    xargs -r sed -i -E "s#(^|[[:space:]\"=]|-I|-L)/usr(/|\"|\$)#\1$P/usr\2#g"
  grep -rnE '(^|[^[:alnum:]_.-])/usr(/|"|$)' "$P" --include='*.pc' --include='*.cmake' && { log "/usr left in the files above"; return 1; }
  # protoc (and the gRPC plugins it starts) and pkgconf need the bundle's libraries: only they get them.
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libpath" "$P/usr/bin/protoc" > "$P/wrap/protoc"
  printf '#!/bin/sh\nPKG_CONFIG_LIBDIR=%s LD_LIBRARY_PATH=%s exec %s "$@"\n' \
    "$P/usr/lib/$arch/pkgconfig:$P/usr/share/pkgconfig" "$libpath" "$P/usr/bin/pkgconf" > "$P/wrap/pkg-config"
  chmod +x "$P"/wrap/*
  # Each bundled program and library must find every library it needs: the bundle's, or the
  # system's base ones that gpu-bundle.sh leaves out (listed, to see what the system serves).
  local files=("$P"/usr/bin/{protoc,grpc_cpp_plugin,grpc_python_plugin,pkgconf} "$P/usr/lib/$arch"/*.so.* "$P/lib/$arch"/*.so.*)
  local f deps=""
  for f in "${files[@]}"; do
    [[ -L $f ]] || deps+=$(env -i LD_LIBRARY_PATH="$libpath" ldd "$f" | awk -v f="$f" -v p="$P" '
      /not found/ {print "MISSING " $1 " for " f; next} $3 ~ /^\// && index($3, p) != 1 {print "system " $3}')$'\n'
  done
  log "from the system: $(grep '^system' <<<"$deps" | cut -d' ' -f2 | sort -u | xargs)"
  # Reported, not fatal: a library dt's programs do not load may lack one (the build will tell).
  if grep '^MISSING' <<<"$deps"; then log "WARNING: libraries missing (above)"; results+=("unpack:missing-libraries"); fi
  echo "$stamp" > "$P/.bundle"
}

tools() {
  # Bundled protoc, both gRPC plugins and pkgconf run with the bundle's libraries alone.
  local gen=$OUT/.protoc-test
  rm -rf "$gen" && mkdir -p "$gen" &&
    env -i LD_LIBRARY_PATH="$libpath" "$P/usr/bin/protoc" --version &&
    env -i "$P/wrap/protoc" --proto_path=proto --cpp_out="$gen" --grpc_out="$gen" \
      --plugin=protoc-gen-grpc="$P/usr/bin/grpc_cpp_plugin" proto/dt/v1/*.proto &&
    env -i "$P/wrap/protoc" --proto_path=proto --python_out="$gen" --grpc_python_out="$gen" \
      --plugin=protoc-gen-grpc_python="$P/usr/bin/grpc_python_plugin" proto/dt/v1/*.proto &&
    log "generated $(find "$gen" -type f | wc -l) files from $(ls proto/dt/v1/*.proto | wc -l) protos" &&
    env -i "$P/wrap/pkg-config" --modversion re2 protobuf grpc++ libcurl openssl | xargs echo "pkg-config: re2 protobuf grpc++ libcurl openssl:"
  local rc=$?; rm -rf "$gen"; return $rc
}

# --local-check: Debian's LibTorch (with the glog, gflags and libunwind its CMake config finds) and
# the C library's headers (civetweb's config finds libdl and librt), linked file by file into a
# root of their own: the only other place the finds may look.
sys_root() {
  local pkgs so f
  pkgs=$({ for so in torch torch_cpu c10 unwind gflags glog; do
    f=/usr/lib/$arch/lib$so.so; dpkg -S "$f" "$(readlink -f "$f")" 2>/dev/null; done; echo libc6-dev; } | cut -d: -f1 | sort -u)
  rm -rf "$TR" && mkdir -p "$TR" || return
  dpkg -L $pkgs | while read -r f; do [[ -d $f ]] || echo "$f"; done | xargs -d '\n' cp -s --parents -t "$TR" 2>/dev/null
  log "LibTorch and C library root $TR: $(echo $pkgs)"
}

configure() {
  local torch_prefix args
  if [[ $mode == gpu ]]; then
    torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || return
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # the H200; skips the wheel's GPU probe
    command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
  else
    sys_root || return
    torch_prefix=$TR/usr/lib/$arch/cmake
  fi
  # The same options in both modes. RPATH (not RUNPATH, hence --disable-new-dtags) also serves the
  # libraries' own dependencies (libgrpc++ -> libcares), so dt's programs need no LD_LIBRARY_PATH.
  # Debian's curl and openssl headers partly live in include/x86_64-linux-gnu, which g++ searches
  # in /usr only. CMAKE_POLICY_VERSION_MINIMUM: a CMake 4 (pip's) still reads the older configs.
  args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DDT_BUILD_BENCH=OFF
    "-DCMAKE_PREFIX_PATH=$P/usr;$torch_prefix" "-DTorch_DIR=$torch_prefix/Torch"
    "-DProtobuf_PROTOC_EXECUTABLE=$P/wrap/protoc" "-DPKG_CONFIG_EXECUTABLE=$P/wrap/pkg-config"
    "-DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES=$P/usr/include/$arch"
    "-DCMAKE_BUILD_RPATH=$P/usr/lib/$arch;$P/lib/$arch" -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  if [[ $mode != gpu ]]; then
    # Every find_package, find_path and find_library looks under these two roots only.
    args+=("-DCMAKE_FIND_ROOT_PATH=$P;$TR" -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY
      -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY)
    rm -rf "$B"
  fi
  log "cmake -S . -B $B ${args[*]}"
  cmake -S . -B "$B" "${args[@]}" && return
  local rc=$? f
  for f in CMakeError.log CMakeConfigureLog.yaml; do [[ -f $B/CMakeFiles/$f ]] && cp "$B/CMakeFiles/$f" "$OUT/"; done
  return $rc
}

leaks() {
  # Any /usr/include or /usr/lib path left in the compile and link lines or the cache, once the
  # bundle's and LibTorch's are masked, is a dependency found outside the bundle.
  local allowed="$P/usr" found
  [[ $mode != gpu ]] && allowed="$allowed|$TR/usr"
  # (The cache's comments and GNUInstallDirs' CMAKE_INSTALL_* name /usr without finding anything.)
  found=$(grep -hvE '^(//|CMAKE_INSTALL_)' "$B/build.ninja" "$B/CMakeCache.txt" | sed -E "s#($allowed)/#@/#g" | tr ' ;:"=' '\n' |
    grep -E '/usr/(include|lib)' | sed -E 's#^(-I|-L|-isystem|-Wl,-rpath,)##' | sort | uniq -c)
  log "link flags by name: $(grep -ohE '(^| )-l[[:alnum:]_+.-]+' "$B/build.ninja" | sort -u | xargs)"
  [[ $mode != gpu ]] && log "from $TR: $(grep -ohE "$TR/[^ ;:\"]*" "$B/build.ninja" | sed -E "s#$TR/usr/(lib/$arch|include)/##" | cut -d/ -f1 | sort -u | xargs)"
  [[ -z $found ]] && { log "no /usr/include or /usr/lib path outside the bundle"; return 0; }
  echo "$found"; log "paths outside the bundle (above)"
  # Strict where the find root confines the finds; on the GPU machine the C library's and a
  # system CUDA's paths are expected: there the list is for reading.
  [[ $mode == gpu ]]
}

build() {
  cmake --build "$B" -j "${DT_GPU_JOBS:-16}" --target dtcoord dtctl dttrainer trainer_cuda_e2e_test trainer_checkpoint_tests || return
  readelf -d "$B/bin/dttrainer" | grep -E 'R(UN)?PATH'
  log "dttrainer's libraries from the system: $(ldd "$B/bin/dttrainer" | grep -vE "$P|/torch/|/nvidia/" | awk '$3 ~ /^\// {print $1}' | xargs)"
  ldd "$B/bin/dttrainer" "$B/bin/dtcoord" | grep "not found" && return 1
  "$B/bin/dttrainer" --version
}

# Runs a test binary that must run here (gtest_must_run NAME TIMEOUT COMMAND...). Its tests skip
# themselves where they cannot run (no GPU, no DCP): on this machine a skip is a failure, and so is
# running past the timeout.
gtest_must_run() {
  local name=$1 limit=$2 o=$OUT/.gtest.out rc
  shift 2
  timeout "$limit" "$@" 2>&1 | tee "$o"
  rc=${PIPESTATUS[0]}
  ((rc == 124)) && log "$name ran past $limit s"
  grep -q '^\[  SKIPPED \]' "$o" && { log "$name SKIPPED itself: a failure on a GPU machine"; rc=1; }
  rm -f "$o"; return $rc
}

cuda_test() {
  # Without NCCL or a GPU the tests skip themselves. The fused AdamW against LibTorch's and the
  # device-to-host copies' order, then dttrainer.
  local rc=0
  gtest_must_run "the fused AdamW and device copy tests" 120 "$B/bin/trainer_checkpoint_tests" \
    --gtest_filter='StepAdamW.*:DeviceCopies.*' || rc=1
  gtest_must_run "the CUDA test" "${DT_GPU_TEST_TIMEOUT:-300}" "$B/bin/trainer_cuda_e2e_test" \
    --gtest_filter="${DT_GPU_TEST_FILTER:-*}" --gtest_output="json:$OUT/trainer_cuda_e2e_test.json" || rc=1
  return $rc
}

dcp_test() {
  # examples/python/train_dcp.py under dtrun on the wheel's torch (Debian's 1.13 has no DCP: there
  # the test skips itself).
  if [[ ${DT_GPU_DCP:-1} == 0 ]]; then log "DT_GPU_DCP=0: not run"; return 0; fi
  # Built here, not in build: a failure of these stops neither the CUDA test nor the benchmark.
  cmake --build "$B" -j "${DT_GPU_JOBS:-16}" --target dtrun dt_python dtrun_e2e_test || return
  gtest_must_run "the DCP test" "${DT_GPU_DCP_TIMEOUT:-180}" env DT_TEST_TORCH2_PYTHON="$(command -v python3)" \
    "$B/bin/dtrun_e2e_test" --gtest_filter='DtrunTest.Dcp*'
}

bench() {
  if [[ ${DT_GPU_BENCH:-1} == 0 ]]; then log "DT_GPU_BENCH=0: not run"; return 0; fi
  if ! grep -qE "[\"']gpu[\"']" bench/trainer_bench.py; then log "bench/trainer_bench.py has no gpu mode: not run"; return 0; fi
  # The traces stay on the machine; their summary and a compressed copy come back.
  local traces=/tmp/dt-profiles rc
  rm -rf "$traces" && mkdir -p "$traces"
  [[ ${DT_GPU_PROFILE:-1} == 0 ]] && traces=""
  DT_BENCH_BIN=$B/bin DT_BENCH_OUT=$OUT/bench.jsonl DT_BENCH_PYTHON=$(command -v python3) PYTHONUNBUFFERED=1 \
    DT_GPU_PROFILE_DIR=$traces timeout "${DT_GPU_BENCH_TIMEOUT:-300}" python3 bench/trainer_bench.py "${DT_GPU_BENCH_MODE:-gpu}"
  rc=$?
  if [[ -n $traces ]] && ls "$traces"/*.json >/dev/null 2>&1; then
    tar -C /tmp -czf "$OUT/profiles.tar.gz" dt-profiles && log "traces: $(du -sh "$traces" | cut -f1), $(du -h "$OUT/profiles.tar.gz" | cut -f1) compressed"
  fi
  ((rc == 0)) || return $rc
  # The page for docs/benchmarks-gpu.md, the card and its software named as the machine.
  local machine
  machine=$(python3 -c 'import torch, os
p = torch.cuda.get_device_properties(0)
print("%s (%d MiB), driver %s, CUDA %s, torch %s, NCCL %s, %d cores" % (p.name, p.total_memory >> 20,
      os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip(), torch.version.cuda,
      torch.__version__, ".".join(map(str, torch.cuda.nccl.version())), os.cpu_count()))')
  DT_BENCH_MACHINE=$machine DT_BENCH_COMMAND="scripts/gpu-check.sh" \
    python3 bench/report.py "$OUT/bench.jsonl" "$OUT/bench-results.json" "$OUT/benchmarks-gpu.md" full
}

main() {
  log "gpu-check $mode: prefix $P, build $B, output $OUT"
  phase versions versions
  phase unpack unpack && phase tools tools && phase configure configure && {
    phase leaks leaks  # reported; the build goes on
    # The test needs the build; the benchmark needs the build, not a passing test.
    [[ $mode != gpu ]] || { phase build build && { phase test cuda_test; phase dcp dcp_test; phase bench bench; }; }
  }
  log "summary: ${results[*]}"
  [[ " ${results[*]} " != *FAILED* ]]
}
main 2>&1 | tee -a "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
