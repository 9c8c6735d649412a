#!/usr/bin/env bash
# Prints the Python interpreter whose PyTorch (2.x) pipecheck builds, tests and measures against;
# with --install, first makes the project's own environment (.venv/, from requirements.txt) where
# that is the one chosen and it is missing or out of date. Argument (TORCH= in the Makefile):
#   auto:   the active environment's python3 when it imports torch 2.x (a GPU runner's CUDA
#           PyTorch, an activated venv or Conda env): used as it is, nothing installed; else .venv
#   venv:   the project's .venv, whatever else is on PATH
#   /path:  that Python interpreter, which must import torch 2.x
# REQUIREMENTS (default requirements.txt, the newest PyTorch pipecheck supports) names the pins of
# the project's environment: requirements.txt installs into .venv, any other file FILE.txt into
# .venv-FILE (requirements-oldest.txt: .venv-requirements-oldest, the oldest PyTorch supported),
# each redone when its file changes.
# Exits 2 with a message when the choice cannot be honoured: never a silent fallback.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
requirements="${REQUIREMENTS:-requirements.txt}"
case "$requirements" in /*) ;; *) requirements="$root/$requirements" ;; esac
[ -f "$requirements" ] || { echo "REQUIREMENTS=$requirements: no such file" >&2; exit 2; }
if [ "$requirements" = "$root/requirements.txt" ]; then
  venv="$root/.venv"
else
  venv="$root/.venv-$(basename "$requirements" .txt)"
fi
install=0
if [ "${1:-}" = --install ]; then install=1; shift; fi
choice="${1:-auto}"

# The major version of the torch `$1` imports, or nothing when it imports none.
torch_major() {
  "$1" -c 'import torch; print(torch.__version__.split(".")[0])' 2>/dev/null | tail -n 1
}

# The project's environment: the requirements installed into $venv, redone when the file changed
# (its copy in the environment says what was installed).
project_venv() {
  local stamp="$venv/pipecheck-requirements.txt"
  if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
    echo "$venv/bin/python"; return
  fi
  if [ "$install" = 0 ]; then
    echo "TORCH=$choice: the project's environment $venv is missing or older than $(basename "$requirements");" \
         "'make deps' (or any make target without NO_INSTALL=1) installs it" >&2
    exit 2
  fi
  echo "torch-python: installing $(basename "$requirements") into $venv (PyTorch's CUDA wheel: a few GB)" >&2
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2 || { echo "torch-python: 'python3 -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 2; }
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2 ||
    { echo "torch-python: pip install -r $(basename "$requirements") into $venv failed" >&2; exit 2; }
  cp "$requirements" "$stamp"
  echo "$venv/bin/python"
}

case "$choice" in
  auto)
    active=$(command -v python3 || true)
    if [ -n "$active" ] && [ "$active" != "$venv/bin/python3" ] && [ "$(torch_major "$active")" = 2 ]; then
      echo "$active"
    else
      project_venv
    fi ;;
  venv) project_venv ;;
  /*)
    [ -x "$choice" ] || { echo "TORCH=$choice: not an executable Python interpreter" >&2; exit 2; }
    major=$(torch_major "$choice")
    [ "$major" = 2 ] || { echo "TORCH=$choice: it imports ${major:+torch $major.x}${major:-no torch}; pipecheck needs PyTorch 2.x" >&2; exit 2; }
    echo "$choice" ;;
  *) echo "TORCH=$choice: expected auto, venv or the absolute path of a Python interpreter with torch 2.x" >&2; exit 2 ;;
esac
