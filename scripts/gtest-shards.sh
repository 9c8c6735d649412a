#!/usr/bin/env bash
# Runs a GoogleTest binary as SHARDS processes at once (GoogleTest's own sharding: every test in
# exactly one shard), each shard's output in its own log; prints each shard's verdict, the whole
# log of any shard that failed, and exits non-zero if any did.
#   scripts/gtest-shards.sh SHARDS BINARY [gtest flags...]
set -uo pipefail
if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 SHARDS BINARY [gtest flags...] (SHARDS a positive integer, got '${1:-}')" >&2
  exit 2
fi
shards=$1 binary=$2
shift 2
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((shard = 0; shard < shards; ++shard)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard "$binary" "$@" >"$logs/$shard.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((shard = 0; shard < shards; ++shard)); do
  if wait "${pids[$shard]}"; then
    echo "shard $shard of $shards: $(grep -E '^\[  PASSED  \]' "$logs/$shard.log" || echo 'passed')"
  else
    status=$?
    echo "shard $shard of $shards: FAILED (exit $status); its log:"
    cat "$logs/$shard.log"
    failed=1
  fi
done
exit $failed
