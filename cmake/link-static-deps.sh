#!/usr/bin/env bash
# Linker launcher for the binaries a run starts in a chain (dtctl, its launcher, dtrun, dtslot):
# links each shared library of the link line from its static archive where the -dev package
# ships one (gRPC, protobuf, Abseil, OpenSSL, re2, c-ares, zlib, yaml-cpp), and libstdc++ and
# libgcc statically. Only glibc stays shared.
#
# Why: most of a client's start was the dynamic loader mapping and relocating ~57 libraries
# (dtctl --help: 25 ms shared, 9 ms static on the 2-core VM), and a local run starts four such
# processes before the program's first line (bench/findings.md, 2026-12-02).
#
# CMake calls it as `link-static-deps.sh <compiler> <arguments...>` (CXX_LINKER_LAUNCHER).
# Archives are order-sensitive where shared libraries are not, so every library goes into one
# --start-group/--end-group. A library without an archive beside its .so stays shared; then the
# binary would hold a static libstdc++ beside that library's shared one (and maybe two copies of
# protobuf or Abseil), so the result is checked and, if anything but glibc is left shared, linked
# again exactly as CMake asked (all shared), with a warning.
set -euo pipefail

# glibc's own libraries: linked shared, as the system's loader expects.
glibc_libs=" c m dl rt pthread util resolv mvec "
is_glibc() { [[ $glibc_libs == *" $1 "* ]]; }

# -L directories of the line, then the defaults: where ld looks for -lX, in its order.
search_dirs=()
for arg in "$@"; do
  if [[ $arg == -L?* ]]; then search_dirs+=("${arg#-L}"); fi
done
search_dirs+=("/usr/lib/$(uname -m)-linux-gnu" /usr/lib "/lib/$(uname -m)-linux-gnu" /lib)

output=""
args=()
grouped=0
previous=""
for arg in "$@"; do
  [[ $previous == -o ]] && output="$arg"
  previous="$arg"
  case "$arg" in
    /*.so | /*.so.[0-9]*)
      dir="${arg%/*}"
      base="${arg##*/}"
      name="${base%%.so*}"
      if ! is_glibc "${name#lib}" && [[ -f $dir/$name.a ]]; then arg="$dir/$name.a"; fi ;;
    -l:*) ;;  # an exact file name: as given
    -l?*)
      name="${arg#-l}"
      if ! is_glibc "$name"; then
        # The directory ld would take the library from; its archive only if it is there too.
        for dir in "${search_dirs[@]}"; do
          if [[ -f $dir/lib$name.so || -f $dir/lib$name.a ]]; then
            [[ -f $dir/lib$name.a ]] && arg="$dir/lib$name.a"
            break
          fi
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

"${args[@]}" -static-libstdc++ -static-libgcc
if [[ -z $output ]]; then exit 0; fi
left=()
for needed in $(readelf -d "$output" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
  name="${needed%%.so*}"
  if [[ $name != ld-linux* ]] && ! is_glibc "${name#lib}"; then left+=("$needed"); fi
done
if [[ ${#left[@]} -gt 0 ]]; then
  echo "link-static-deps.sh: $output would keep ${left[*]} shared beside a static libstdc++;" \
       "linked all shared instead" >&2
  exec "$@"
fi
