#!/usr/bin/env bash
# Installs requirements-frameworks.txt (DeepSpeed, Megatron-Core) into the Python interpreter $1,
# holding its torch where it is; skipped when that interpreter already has this file's pins (its
# copy beside the interpreter's environment says what was installed). Exits 2 with a message when
# the install fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python="${1:?usage: install-frameworks.sh PYTHON}"
requirements="$root/requirements-frameworks.txt"
prefix=$("$python" -c 'import sys; print(sys.prefix)')
stamp="$prefix/pipecheck-frameworks.txt"
if cmp -s "$requirements" "$stamp" 2>/dev/null; then exit 0; fi
torch=$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))') ||
  { echo "install-frameworks: $python imports no torch" >&2; exit 2; }
echo "install-frameworks: installing $(basename "$requirements") into $prefix (torch $torch held)" >&2
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch" > "$constraints"
pip=("$python" -m pip install --quiet --disable-pip-version-check -c "$constraints")
# DeepSpeed's source build imports setuptools and wheel from this environment (no isolation).
grep -E '^(setuptools|wheel)==' "$requirements" > "$constraints.build"
"${pip[@]}" -r "$constraints.build" >&2 && rm -f "$constraints.build" ||
  { rm -f "$constraints.build"; echo "install-frameworks: pip could not install setuptools and wheel" >&2; exit 2; }
DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation -r "$requirements" >&2 ||
  { echo "install-frameworks: pip install -r $(basename "$requirements") into $prefix failed" >&2; exit 2; }
cp "$requirements" "$stamp"
