#!/usr/bin/env bash
# For CUDA builds (docker/trainer-cuda.Dockerfile): NVIDIA's CUDA toolkit for Debian 12 and an
# upstream CUDA LibTorch (which has NCCL compiled in) unpacked into DIR. Needs network access.
#
#   scripts/setup-cuda.sh DIR [--check]     --check: print what would be installed, change nothing
set -euo pipefail
dir="${1:?usage: setup-cuda.sh DIR [--check]}"
cuda_version="${DT_CUDA_VERSION:-12-4}"
libtorch_url="${DT_LIBTORCH_URL:-https://download.pytorch.org/libtorch/cu124/libtorch-cxx11-abi-shared-with-deps-2.4.1%2Bcu124.zip}"
if [[ "${2:-}" == "--check" ]]; then
  echo "would install cuda-toolkit-${cuda_version} from NVIDIA's debian12 repository, and libgloo-dev"
  echo "would unpack ${libtorch_url} into ${dir}"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends ca-certificates curl unzip gnupg
curl -fsSL -o /tmp/cuda-keyring.deb https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb
apt-get update -q
# An upstream LibTorch ships no Gloo headers, which its ProcessGroupGloo.hpp includes.
apt-get install -y -q --no-install-recommends "cuda-toolkit-${cuda_version}" libgloo-dev
curl -fsSL -o /tmp/libtorch.zip "$libtorch_url"
mkdir -p "$(dirname "$dir")"
unzip -q /tmp/libtorch.zip -d /tmp/libtorch-unpacked
mv /tmp/libtorch-unpacked/libtorch "$dir"
echo "CUDA LibTorch in $dir (Torch_DIR=$dir/share/cmake/Torch)"
