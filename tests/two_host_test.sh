#!/usr/bin/env bash
# One parity scenario across two "hosts": two network namespaces made here, joined by a veth
# pair, each running torchrun --nnodes 2 --node-rank N without --standalone (torchrun's agent
# serves the store on MASTER_PORT, as on a real cluster). Rank 0 (node 0) must write a PASS.
# Exits 77 (CTest's skip, reported as skipped) where namespaces cannot be made (not root, no
# iproute2, a sandbox without CAP_NET_ADMIN).
set -uo pipefail
pipecheck="$1"
suite="$2"
scenario="${3:-ws2_tied_gpt2}"
source "$(dirname "$0")/torch_python.sh"
suffix="$$"
a="pc_a_$suffix" b="pc_b_$suffix"
work=$(mktemp -d)
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
if ! { ip netns add "$a" && ip netns add "$b" &&
       ip link add "va$suffix" netns "$a" type veth peer name "vb$suffix" netns "$b" &&
       ip -n "$a" addr add 10.77.0.1/24 dev "va$suffix" && ip -n "$b" addr add 10.77.0.2/24 dev "vb$suffix" &&
       ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
       ip -n "$a" link set "va$suffix" up && ip -n "$b" link set "vb$suffix" up; } 2>"$work/ns.err"; then
  echo "SKIPPED: cannot make network namespaces here: $(tr '\n' ' ' < "$work/ns.err")"; exit 77
fi
node() {  # node_rank, namespace
  timeout 240 ip netns exec "$2" "$python" -m torch.distributed.run --nnodes 2 --node-rank "$1" \
    --nproc-per-node 1 --master-addr 10.77.0.1 --master-port 29500 --no-python \
    "$pipecheck" worker --scenarios "$suite" --scenario "$scenario" --out "$work/out$1" --threads 1 \
    >"$work/node$1.log" 2>&1
}
node 0 "$a" & first=$!
node 1 "$b" & second=$!
wait $first; code0=$?
wait $second; code1=$?
summary="$work/out0/summary.csv"
status=$(tail -n 1 "$summary" 2>/dev/null | cut -d, -f2)
if [ "$code0" -ne 0 ] || [ "$code1" -ne 0 ] || [ "$status" != "PASS" ]; then
  echo "FAIL: node 0 exited $code0, node 1 exited $code1, status '${status:-no summary}'"
  echo "--- node 0"; tail -n 20 "$work/node0.log"; echo "--- node 1"; tail -n 20 "$work/node1.log"
  echo "0 passed, 1 failed"; exit 1
fi
echo "two hosts (10.77.0.1, 10.77.0.2 in their own namespaces): $scenario $status"
echo "1 passed, 0 failed"
