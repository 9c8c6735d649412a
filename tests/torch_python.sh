# Sourced by the torchrun tests: the Python with torch (PIPECHECK_PYTHON, set by CTest; Debian's
# /usr/bin/python3 otherwise) in $python, or exit 77 (CTest's skip) when it cannot run torchrun.
python="${PIPECHECK_PYTHON:-/usr/bin/python3}"
if ! "$python" -c "import torch.distributed.run" 2>/dev/null; then
  echo "SKIPPED: $python cannot import torch.distributed.run (python3-torch is not available)"
  exit 77
fi
