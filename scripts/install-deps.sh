#!/usr/bin/env bash
# Installs the Debian packages pipecheck builds and tests with, only those missing.
# Needs root (or sudo) and Debian's registry only when something is missing.
set -euo pipefail

# PIPECHECK_TORCH (from scripts/torch-prefix.sh): "debian" (the default) installs Debian's CPU
# LibTorch and python3-torch; anything else means another LibTorch is used, so neither is.
torch="${PIPECHECK_TORCH:-debian}"
# python3-yaml and python3-markdown: the tests parse the CI pipelines in ci/ and render the Markdown summary.
packages=(
  cmake make g++ iproute2 python3-yaml python3-markdown
  libgloo-dev
  libgtest-dev libbenchmark-dev libfccp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
)

# Debian's LibTorch calls libblas.so.3, which is the slow netlib reference BLAS unless an
# optimised one is installed: OpenBLAS (OpenMP build, sharing LibTorch's thread pool) is ~19x faster.
if [ "$torch" = debian ]; then packages+=(libtorch-dev python3-torch libopenblas0-openmp); fi

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
