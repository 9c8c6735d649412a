#!/usr/bin/env bash
# Prints which LibTorch to build against: "debian" (Debian's libtorch-dev, found by CMake on its
# own) or a CMake prefix. Argument: auto | debian | python | /a/prefix (see the Makefile).
#   auto:   python3's torch when it is a CUDA build with a visible GPU, else debian
#   python: python3's torch (torch.utils.cmake_prefix_path), CUDA or not
# Exits 2 with a message when the choice cannot be honoured: never a silent fallback.
set -euo pipefail
choice="${1:-auto}"
python_prefix() {
  python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null
}
case "$choice" in
  debian) echo debian ;;
  auto)
    if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      python_prefix
    else
      echo debian
    fi ;;
  python)
    prefix=$(python_prefix) || { echo "TORCH=python: python3 ($(command -v python3 || echo none)) cannot import torch" >&2; exit 2; }
    echo "$prefix" ;;
  /*)
    [ -d "$choice" ] || { echo "TORCH=$choice: no such directory" >&2; exit 2; }
    echo "$choice" ;;
  *) echo "TORCH=$choice: expected auto, debian, python or an absolute prefix" >&2; exit 2 ;;
esac
