#!/usr/bin/env bash
# One parity scenario launched by torchrun (the PyTorch pipecheck is built against) as the README writes it, without
# --standalone (torchrun's agent serves the store on MASTER_PORT), instead of pipecheck run:
# the worker must read torchrun's environment, rendezvous, and have rank 0 write a PASS report.
# Usage: torchrun_test.sh PIPECHECK SUITE [SCENARIO [PROCESSES]] (PROCESSES: world_size x
# data_parallel, 2 unless given).
set -uo pipefail
pipecheck="$1"
suite="$2"
scenario="${3:-ws2_tied_gpt2}"
processes="${4:-2}"
source "$(dirname "$0")/torch_python.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The store's port: below Linux's ephemeral range (32768 on), where the connections of tests running
# beside this one take their ports, and free when chosen. If another process takes it before
# torchrun binds it (EADDRINUSE), the launch is tried again on another port, at most three times.
free_port() {
  "$python" - <<'PY'
import random
import socket
for _ in range(200):
    port = random.randint(20000, 32000)
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
PY
}
for attempt in 1 2 3; do
  "$python" -m torch.distributed.run --nproc-per-node="$processes" --master-port "$(free_port)" --no-python \
    "$pipecheck" worker --scenarios "$suite" --scenario "$scenario" --out "$work/out" --threads 1 >"$work/log" 2>&1
  code=$?
  cat "$work/log"
  [ "$code" -ne 0 ] && grep -q 'EADDRINUSE' "$work/log" || break
  echo "torchrun: the store's port was taken (attempt $attempt); trying another"
done
summary="$work/out/summary.csv"
if [ "$code" -ne 0 ] || [ ! -f "$summary" ]; then
  echo "FAIL: torchrun exited $code; summary: $(cat "$summary" 2>/dev/null || echo missing)"
  echo "0 passed, 1 failed"
  exit 1
fi
status=$(tail -n 1 "$summary" | cut -d, -f2)
if [ "$status" != "PASS" ]; then
  echo "FAIL: status $status"; cat "$summary"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "torchrun: $scenario $status"
echo "1 passed, 0 failed"
