#!/usr/bin/env bash
# What a GPU machine checks that a CPU one cannot, in stages that each fit one short call on a
# lent GPU machine, every log under $OUT (default build-gpu/checks). Run from the project root:
#
#   scripts/gpu-checks.sh build test       # then: suite, ws1, peer
#
#   build   configure and build against python3's CUDA LibTorch with -Werror (deps from
#           .gpu-bundle/ when the tree carries one: ../shared/gpu-bundle/README.md)
#   test    make test's CTest run, _CUDA tests included (JUnit in $OUT/ctest.xml)
#   suite   pipecheck run --scenarios scenarios/gpu.csv (reports in $OUT/gpu-suite)
#   ws1     the throughput rows alone, three rounds: world size 1 with 8 microbatches against the
#           reference, fp32 and bf16 (issue 11's GPU target), and the reference accumulating over
#           the same microbatches (pipecheck reference --microbatched)
#   peer    benchmarks/race.py on benchmarks/peer.csv, 2 and 4 ranks on the machine's CPU,
#           pipecheck's trainer and torch.distributed.pipelining's (trainer=torch) alternated over
#           3 rounds (PEER_SCENARIOS="peer_2ranks_1f1b_m8" races one pair: each takes a few minutes)
#
# A stage's failure is recorded in $OUT/status and the next stage still runs; the exit status is
# that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build-gpu/checks}"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"  # absolute: the test stage writes it from inside the build directory
[ $# -gt 0 ] || { echo "usage: $0 build|test|suite|ws1|peer ..." >&2; exit 2; }

prefix_path=""
if [ -f .gpu-bundle/env.sh ]; then
  # shellcheck disable=SC1091
  source .gpu-bundle/env.sh
  prefix_path="$PIPECHECK_DEPS_PREFIX"
fi
make_args=(BUILD_DIR="$BUILD_DIR" JOBS="$JOBS")
[ -n "$prefix_path" ] && make_args+=(NO_INSTALL=1 PREFIX_PATH="$prefix_path")
pipecheck="$BUILD_DIR/pipecheck"

stage_build() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  make build "${make_args[@]}"  # -Werror: a warning fails it; configure prints "pipecheck: CUDA 1, nccl transport 1"
}
stage_test() {
  (cd "$BUILD_DIR" && ctest --output-on-failure -j"$JOBS" -LE long --output-junit "$OUT/ctest.xml")
  local rc=$?
  # Each _CUDA test and its JUnit status (run, fail, skipped, ...): none may be skipped on a GPU.
  grep -o '<testcase name="[^"]*_CUDA[^"]*"[^>]*status="[a-z]*"' "$OUT/ctest.xml" 2>/dev/null |
    sed -E 's/<testcase name="([^"]*)".*status="([a-z]*)"/\2 \1/' | sort
  return $rc
}
stage_suite() { "$pipecheck" run --scenarios scenarios/gpu.csv --out "$OUT/gpu-suite"; }
stage_ws1() {
  # Per round: the pipeline at world size 1 with its full-batch reference (pipecheck run), then the
  # reference accumulating over the same 8 microbatches (what the microbatch size alone costs).
  local rc=0
  for round in 1 2 3; do
    "$pipecheck" run --scenarios scenarios/gpu.csv --only 'gpu_throughput*' --out "$OUT/ws1-round$round" || rc=1
    "$pipecheck" reference --microbatched --scenarios scenarios/gpu.csv --only 'gpu_throughput*' || rc=1
  done
  echo "scenario,status,dtype,ref_step_ms,pp_step_ms,ref_peak_bytes,pp_peak_bytes_max"
  for round in 1 2 3; do
    tail -n +2 "$OUT/ws1-round$round/summary.csv" | cut -d, -f1,2,9,20,21,24,25 | sed "s/^/round $round: /"
  done
  return $rc
}
stage_peer() {
  local rc=0
  local only=()
  for scenario in ${PEER_SCENARIOS:-peer_2ranks_1f1b_m8 peer_4ranks_1f1b_m8}; do only+=(--only "$scenario"); done
  python3 benchmarks/race.py --pipecheck "$pipecheck" --scenarios benchmarks/peer.csv "${only[@]}" --rounds 3 \
    --threads 1 || rc=1
  return $rc
}

for stage in "$@"; do
  case "$stage" in build|test|suite|ws1|peer) ;; *) echo "unknown stage '$stage' (build, test, suite, ws1, peer)" >&2; exit 2 ;; esac
done
first_failure=0
for stage in "$@"; do
  started=$(date +%s)
  "stage_$stage" >"$OUT/$stage.log" 2>&1
  rc=$?
  line="$stage rc=$rc $(( $(date +%s) - started ))s"
  echo "$line" | tee -a "$OUT/status"
  tail -n 25 "$OUT/$stage.log"
  [ $rc -ne 0 ] && [ $first_failure -eq 0 ] && first_failure=$rc
done
exit $first_failure
