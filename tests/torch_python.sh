# Sourced by the torchrun tests: the Python of the PyTorch pipecheck is built against
# (PIPECHECK_PYTHON, set by CTest) in $python. Without torchrun there the test fails: every
# build has PyTorch 2.x, so a missing torchrun is a broken environment, not a reason to skip.
python="${PIPECHECK_PYTHON:?PIPECHECK_PYTHON is not set (CTest sets it)}"
if ! "$python" -c "import torch.distributed.run" 2>/dev/null; then
  echo "FAIL: $python cannot import torch.distributed.run"
  exit 1
fi
