#!/usr/bin/env bash
# Installs the Debian packages pipecheck builds and tests with, only those missing.
# Needs root (or sudo) and Debian's registry only when something is missing.
set -euo pipefail

packages=(
  cmake make g++ iproute2
  libtorch-dev libgloo-dev python3-torch
  # Debian's LibTorch calls libblas.so.3, which is the slow netlib reference BLAS unless an
  # optimised one is installed: OpenBLAS (OpenMP build, sharing LibTorch's thread pool) is ~19x faster.
  libopenblas0-openmp
  libgtest-dev libbenchmark-dev libfccp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
