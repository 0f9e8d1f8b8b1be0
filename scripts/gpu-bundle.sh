#!/usr/bin/env bash
# Downloads into .gpu-bundle/debs/ the Debian 12 packages that build dtcoord, dtctl, dttrainer and
# trainer_cuda_e2e_test on a machine with no network and no apt (the borrowed GPU machine, Ubuntu
# 24.04). scripts/gpu-check.sh unpacks them there into a prefix of their own, not into /.
# Run on Debian 12 with network:  scripts/gpu-bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-bundle/debs

# What those targets need: scripts/setup.sh's "RPC and core libraries", Gloo's headers, GoogleTest,
# and pkgconf (gRPC's CMake config finds re2 with pkg-config; the GPU machine may have none).
roots=(libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libabsl-dev
  libsqlite3-dev libssl-dev libcurl4-openssl-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
  prometheus-cpp-dev zlib1g-dev libre2-dev libgloo-dev libgtest-dev libgmock-dev pkgconf)

# Not taken, nor what only they pull in:
# - the C library, the compiler's runtime and the toolchain: Ubuntu's g++ 13 builds with its own.
#   An older libstdc++6 (GCC 12's) in front of it would break every g++ 13 program (GLIBCXX_3.4.32).
# - libraries that every Ubuntu 24.04 image has (apt, dpkg, gnutls and systemd's libraries need
#   them), under the same soname and newer: they serve Debian's libraries as well. (Ubuntu calls
#   some ...t64, e.g. libgnutls30t64: the same libraries on amd64.)
#   (libssl3, krb5, sqlite, nghttp2 and the like are not surely there: they are taken.)
# - Debian's maintainer tooling (debconf, dpkg, perl-base).
exclude=" libc6 libc6-dev libc-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1
  gcc-12-base libstdc++6 libstdc++-12-dev libgomp1 libatomic1 zlib1g libzstd1 liblzma5 libbz2-1.0
  liblz4-1 libselinux1 libpcre2-8-0 libffi8 libgmp10 libgnutls30 libnettle8 libhogweed6 libidn2-0
  libp11-kit0 libtasn1-6 libgcrypt20 libgpg-error0 libsystemd0 libudev1 libcap2 libcap-ng0 libmd0
  libcom-err2 libtinfo6 libncursesw6 libdb5.3 libaudit1 libuuid1 libblkid1 libmount1
  debconf debconf-2.0 dpkg perl-base "
# Taken without their dependencies: dt needs Gloo's headers only (the wheel has Gloo compiled in,
# so not libgloo0, hiredis or ibverbs). googletest (GoogleTest's sources) is not taken:
# libgtest-dev holds the built libraries. (civetweb, a server program, is: civetweb's CMake config
# checks that it is there.)
alone=" libgloo-dev "
skip=" googletest "
exclude=" $(echo $exclude) "  # one space between names, for the matches below

# The first of each alternative, and the first provider of a virtual package.
deps() {
  apt-cache depends --no-recommends --no-suggests --no-enhances --no-breaks --no-replaces \
    --no-conflicts "$1" | awk '
    $1 ~ /Depends:$/ { v = 0; if (!alt) { if ($2 ~ /^</) v = 1; else print $2 } alt = ($1 ~ /^\|/); next }
    v && /^    / { print $1; v = 0 }'
}

declare -A seen
want=()
queue=("${roots[@]}")
while ((${#queue[@]})); do
  p=${queue[0]%:amd64}; queue=("${queue[@]:1}")
  [[ -n ${seen[$p]:-} || $exclude$skip == *" $p "* ]] && continue
  seen[$p]=1
  want+=("$p")
  [[ $alone == *" $p "* ]] && continue
  mapfile -t -O "${#queue[@]}" queue < <(deps "$p")
done

rm -rf "$out" && mkdir -p "$out"
# apt-get download writes to the current directory; _apt cannot write here, hence the warning.
(cd "$out" && apt-get download -q "${want[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
n=$(ls "$out"/*.deb | wc -l)
if ((n != ${#want[@]})); then echo "gpu-bundle: $n .deb files for ${#want[@]} packages" >&2; exit 1; fi
echo "gpu-bundle: ${#want[@]} packages: ${want[*]}"
# What a device run carries: the working tree (tracked and untracked, not ignored) and the bundle.
mib() { awk '{s += $1} END {printf "%.1f MiB", s / 1048576}'; }
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "gpu-bundle: $(du -cb "$out"/*.deb | tail -1 | mib) in $out; with the working tree $( (echo "$tree"; du -cb "$out"/*.deb | tail -1) | mib) (a device run carries at most 64 MiB)"
