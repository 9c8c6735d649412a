#!/usr/bin/env bash
# What a GPU machine checks that a CPU one cannot, in stages sized to a lent GPU machine's short
# calls, every log and report under $OUT (default build-gpu/checks). Run from the project root:
#
#   scripts/gpu-checks.sh build cuda suite ws1 eager      # first call: build and correctness
#   scripts/gpu-checks.sh peer baseline test              # second call, on the same warm machine
#
#   build     configure and build against python3's CUDA LibTorch (deps from .gpu-bundle/ when the
#             tree carries one: ../shared/gpu-bundle/README.md) with -Wall -Wextra, warnings kept as
#             warnings (PIPECHECK_WERROR=OFF) so that one build serves every later stage; every
#             warning is listed in build-warnings.txt and the stage fails on any, which is exactly
#             when -Werror would have failed the build
#   cuda      the _CUDA tests alone, each with its JUnit status (none may be skipped on a GPU)
#   suite     pipecheck run --scenarios scenarios/gpu.csv (reports, JUnit, Markdown in $OUT/suite1)
#   ws1       the throughput rows at world size 1, WS1_ROUNDS rounds (3): the pipeline against the full-batch
#             reference, and the reference accumulating over the same microbatches
#             (pipecheck reference --microbatched), fp32 and bf16
#   eager     the reference against PyTorch eager on the same model, weights and batch
#             (benchmarks/eager.py, alternated over three rounds), then one run of each split by phase
#   peer      pipecheck's trainer against PyTorch's pipelining on the GPU (benchmarks/peer-gpu.csv:
#             one rank, NCCL refusing two ranks on one GPU), alternated over PEER_ROUNDS rounds (3);
#             PEER_ONLY="a b" races those pairs alone
#   baseline  BASELINE_RUNS - 1 more runs of the GPU suite (3 in all by default), merged with suite1
#             into $OUT/baseline (pipecheck baseline update; commit it under reports/baselines/RUNNER)
#   test      make test's CTest run, everything but the long sweeps (JUnit in $OUT/ctest.xml)
#
# DEADLINE (seconds since the epoch) bounds the whole call: each stage gets the time left and is
# skipped when under a minute is. A stage's result is recorded in $OUT/status and the next stage
# still runs; the exit status is that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build-gpu/checks}"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
DEADLINE="${DEADLINE:-$(( $(date +%s) + 86400 ))}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"  # absolute: the test stages write it from inside the build directory
[ $# -gt 0 ] || { echo "usage: $0 build|cuda|suite|ws1|eager|peer|baseline|test ..." >&2; exit 2; }

prefix_path=""
if [ -f .gpu-bundle/env.sh ]; then
  # shellcheck disable=SC1091
  source .gpu-bundle/env.sh
  prefix_path="$PIPECHECK_DEPS_PREFIX"
fi
make_args=(BUILD_DIR="$BUILD_DIR" JOBS="$JOBS")
[ -n "$prefix_path" ] && make_args+=(NO_INSTALL=1 PREFIX_PATH="$prefix_path")
pipecheck="$BUILD_DIR/pipecheck"
# The Python the build was configured with (its torch is the LibTorch pipecheck links).
build_python() { sed -n 's/^PIPECHECK_PYTHON:FILEPATH=//p' "$BUILD_DIR/CMakeCache.txt"; }

stage_build() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))'
  g++ --version | head -1; cmake --version | head -1; nproc
  make configure "${make_args[@]}" || return 1  # prints "pipecheck: CUDA 1, nccl transport 1"
  cmake -S . -B "$BUILD_DIR" -DPIPECHECK_WERROR=OFF >/dev/null || return 1
  local rc=0 started=$SECONDS
  cmake --build "$BUILD_DIR" -j"$JOBS" -- -k 2>&1 | tee "$OUT/build.log"
  rc=${PIPESTATUS[0]}
  grep -E 'warning:|error:' "$OUT/build.log" | sort -u > "$OUT/build-warnings.txt"
  local warnings
  warnings=$(grep -c 'warning:' "$OUT/build-warnings.txt")
  echo "build: rc=$rc in $(( SECONDS - started ))s, $warnings distinct warning lines (-Werror fails on any)"
  [ $rc -ne 0 ] && return 2
  [ "$warnings" -eq 0 ] || return 1
}
stage_cuda() {
  (cd "$BUILD_DIR" && ctest --output-on-failure -j4 -R _CUDA --output-junit "$OUT/ctest-cuda.xml")
  local rc=$?
  # Each _CUDA test and its JUnit status (run, fail, skipped, ...).
  grep -o '<testcase name="[^"]*_CUDA[^"]*"[^>]*status="[a-z]*"' "$OUT/ctest-cuda.xml" 2>/dev/null |
    sed -E 's/<testcase name="([^"]*)".*status="([a-z]*)"/\2 \1/' | sort
  return $rc
}
run_suite() {  # $1: the run's folder under $OUT
  "$pipecheck" run --scenarios scenarios/gpu.csv --out "$OUT/$1" --junit "$OUT/$1/junit.xml" \
    --markdown "$OUT/$1/summary.md"
}
stage_suite() { run_suite suite1; }
stage_ws1() {
  # Per round: the pipeline at world size 1 with its full-batch reference (pipecheck run), then the
  # reference accumulating over the same 8 microbatches (what the microbatch size alone costs).
  # WS1_ROUNDS rounds (3); the suite stage's run of the same rows, when there is one, is listed too.
  local rc=0 rounds=${WS1_ROUNDS:-3}
  for round in $(seq 1 "$rounds"); do
    "$pipecheck" run --scenarios scenarios/gpu.csv --only 'gpu_throughput*' --out "$OUT/ws1-round$round" || rc=1
    "$pipecheck" reference --microbatched --scenarios scenarios/gpu.csv --only 'gpu_throughput*' || rc=1
  done
  # Where the microbatched reference's step goes, phase by phase (the device synchronised at each).
  "$pipecheck" reference --microbatched --phases --scenarios scenarios/gpu.csv --only 'gpu_throughput*' || rc=1
  echo "run,scenario,status,dtype,ref_step_ms,pp_step_ms,ref_peak_bytes,pp_peak_bytes_max"
  for run in suite1 $(seq -f 'ws1-round%g' 1 "$rounds"); do
    [ -f "$OUT/$run/summary.csv" ] &&
      grep '^gpu_throughput' "$OUT/$run/summary.csv" | cut -d, -f1,2,9,20,21,24,25 | sed "s/^/$run,/"
  done
  return $rc
}
stage_eager() {
  "$(build_python)" benchmarks/eager.py --pipecheck "$pipecheck" --scenarios scenarios/gpu.csv --only gpu_throughput_fp32 \
    --only gpu_throughput_bf16 --rounds 3 --phases --workdir "$BUILD_DIR/eager"
}
stage_peer() {
  local only=()
  for name in ${PEER_ONLY:-}; do only+=(--only "$name"); done
  "$(build_python)" benchmarks/race.py --pipecheck "$pipecheck" --scenarios benchmarks/peer-gpu.csv \
    --rounds "${PEER_ROUNDS:-3}" --threads 1 "${only[@]}"
}
stage_baseline() {
  local rc=0 from=(--from "$OUT/suite1")
  for run in $(seq 2 "${BASELINE_RUNS:-3}"); do
    run_suite "suite$run" || rc=1
    from+=(--from "$OUT/suite$run")
  done
  "$pipecheck" baseline update --to "$OUT/baseline" "${from[@]}" || rc=1
  return $rc
}
stage_test() {
  (cd "$BUILD_DIR" && ctest --output-on-failure -j"$JOBS" -LE long --output-junit "$OUT/ctest.xml")
}

stages="build cuda suite ws1 eager peer baseline test"
for stage in "$@"; do
  case " $stages " in *" $stage "*) ;; *) echo "unknown stage '$stage' ($stages)" >&2; exit 2 ;; esac
done
first_failure=0
for stage in "$@"; do
  started=$(date +%s)
  left=$(( DEADLINE - started ))
  if [ $left -lt 60 ]; then
    echo "$stage skipped: ${left}s left before the deadline" | tee -a "$OUT/status"
    [ $first_failure -eq 0 ] && first_failure=124
    continue
  fi
  # The stage runs in a child shell under timeout; its functions and variables come with it.
  export -f "stage_$stage" run_suite build_python 2>/dev/null
  export OUT BUILD_DIR JOBS pipecheck WS1_ROUNDS PEER_ROUNDS PEER_ONLY BASELINE_RUNS
  make_args_string="${make_args[*]}"
  timeout --kill-after=10 "$left" bash -c "make_args=($make_args_string); stage_$stage" >"$OUT/$stage.log" 2>&1
  rc=$?
  line="$stage rc=$rc $(( $(date +%s) - started ))s"
  [ $rc -eq 124 ] && line="$line (stopped at the deadline)"
  echo "$line" | tee -a "$OUT/status"
  tail -n 30 "$OUT/$stage.log"
  [ $rc -ne 0 ] && [ $first_failure -eq 0 ] && first_failure=$rc
done
exit $first_failure
