#!/usr/bin/env bash
# Installs the Debian packages pipecheck builds and tests with, only those missing. LibTorch is
# not among them: it comes from PyPI's torch wheel (scripts/torch-python.sh). Debian supplies
# what the wheel lacks: Gloo's headers, GoogleTest, Google Benchmark, CLI11, nlohmann-json,
# fccp, the compiler and CMake, and python3-venv for the project's .venv.
# Needs root (or sudo) and Debian's registry only when something is missing.
set -euo pipefail

packages=(
  cmake make g++ iproute2 python3-venv
  libgloo-dev
  libgtest-dev libbenchmark-dev libfccp-dev libcli11-dev nlohmann-json3-dev
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
