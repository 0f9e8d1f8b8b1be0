#!/usr/bin/env bash
# Linker launcher for the binaries a run starts in a chain (dtctl, its launcher, dtrun, dtslot):
# links each shared library of the link line from its static archive where the -dev package
# ships one (gRPC, protobuf, Abseil, OpenSSL, re2, c-ares, zlib, yaml-cpp), and libstdc++ and
# libgcc statically. Only glibc stays shared.
#
# Why: most of a client's start is the dynamic loader mapping and relocating ~57 libraries
# (dtctl --help: 26 ms shared, 9 ms static on the 2-core VM), and a local run starts four such
# processes before the program's first line (bench/findings.md, 2026-12-02).
#
# CMake calls it as `link-static-deps.sh <compiler> <arguments...>` (CXX_LINKER_LAUNCHER).
# Archives are order-sensitive where shared libraries are not, so every library goes into one
# --start-group/--end-group. A library without an archive stays shared.
set -euo pipefail

# glibc's own libraries: linked shared, as the system's loader expects.
glibc_libs=" c m dl rt pthread util resolv "
args=()
grouped=0
for arg in "$@"; do
  case "$arg" in
    /*.so | /*.so.[0-9]*)
      archive="${arg%%.so*}.a"
      [[ -f $archive ]] && arg="$archive" ;;
    -l*)
      name="${arg#-l}"
      if [[ $glibc_libs != *" $name "* ]]; then
        for dir in "/usr/lib/$(uname -m)-linux-gnu" /usr/lib; do
          if [[ -f $dir/lib$name.a ]]; then arg="$dir/lib$name.a"; break; fi
        done
      fi ;;
  esac
  if [[ $grouped == 0 && $arg == *.a ]]; then
    args+=(-Wl,--start-group)
    grouped=1
  fi
  args+=("$arg")
done
if [[ $grouped == 1 ]]; then args+=(-Wl,--end-group); fi
exec "${args[@]}" -static-libstdc++ -static-libgcc
