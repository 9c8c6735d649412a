#!/usr/bin/env bash
# The pipecheck CLI's exit codes and messages on good and bad input (DESIGN.md §5).
set -uo pipefail
pipecheck="$1"
source_dir="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# expect CODE PATTERN COMMAND...: runs COMMAND, checks its exit code and that its output matches PATTERN.
expect() {
  local code="$1" pattern="$2"
  shift 2
  local output actual
  output=$("$@" 2>&1)
  actual=$?
  if [ "$actual" -eq "$code" ] && grep -qE -- "$pattern" <<<"$output"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $* -> exit $actual (want $code), output:"
    echo "$output" | head -20
    echo "  (wanted a line matching: $pattern)"
  fi
}

printf 'name,layers,colour\nx,2,red\n' >"$work/unknown.csv"
printf 'name,layers\nx,2\ny,two\n' >"$work/badvalue.csv"
printf 'name,layers,hidden\nok,1,16\n' >"$work/good.csv"

expect 2 "unknown.csv:1:3: unknown column 'colour'" "$pipecheck" validate --scenarios "$work/unknown.csv"
expect 2 "badvalue.csv:3:2: column 'layers', value 'two'" "$pipecheck" reference --scenarios "$work/badvalue.csv"
expect 2 "badvalue.csv:3:2" "$pipecheck" dump --scenarios "$work/badvalue.csv" --scenario x --out "$work/d"
expect 2 "cannot open scenario file" "$pipecheck" reference --scenarios "$work/missing.csv"
expect 2 "no scenario named 'nope'" "$pipecheck" dump --scenarios "$work/good.csv" --scenario nope --out "$work/d"
expect 2 "matches --only 'zz\*'" "$pipecheck" reference --scenarios "$work/good.csv" --only 'zz*'
expect 2 "--bogus" "$pipecheck" reference --bogus
expect 2 "threads" "$pipecheck" reference --threads -1
expect 2 "A subcommand is required|subcommand" "$pipecheck"
expect 0 "Usage|usage" "$pipecheck" --help
expect 0 "1 scenarios, all valid" "$pipecheck" validate --scenarios "$work/good.csv"
expect 0 "^ok +[0-9.]+ +[0-9]+ +[0-9]+\.[0-9]+ [0-9]+\.[0-9]+" "$pipecheck" reference --scenarios "$work/good.csv"
expect 0 "wrote" "$pipecheck" dump --scenarios "$work/good.csv" --scenario ok --out "$work/d"
touch "$work/file"
expect 2 "$work/file" "$pipecheck" dump --scenarios "$work/good.csv" --scenario ok --out "$work/file/sub"
expect 0 "ws1_gpipe_llama" "$pipecheck" reference --scenarios "$source_dir/scenarios/core.csv" --only 'ws1_gpipe*'

# run: bad input is 2 before anything runs; a good suite writes the reports and exits 0.
expect 2 "unknown.csv:1:3: unknown column 'colour'" "$pipecheck" run --scenarios "$work/unknown.csv" --out "$work/r"
expect 2 "badvalue.csv:3:2" "$pipecheck" run --scenarios "$work/badvalue.csv" --out "$work/r"
expect 2 "device" "$pipecheck" run --device tpu --scenarios "$work/good.csv"
printf 'name,world_size,layers,hidden,batch,microbatches,seq_len\npp2,2,2,16,4,2,8\n' >"$work/pp.csv"
expect 0 "1 scenarios, 1 met their expectation" "$pipecheck" run --scenarios "$work/pp.csv" --out "$work/r"
for report in summary params steps ranks timeline; do
  expect 0 "^scenario," head -n 1 "$work/r/$report.csv"
done
expect 0 "^pp2,PASS,pass,1,2,1f1b," tail -n 1 "$work/r/summary.csv"
# A scenario whose ranks fail at start-up (CUDA on a machine without it) is ERROR, naming the
# rank and its output; its summary row keeps every column; the run goes on to the next one.
printf 'name,world_size,layers,hidden,batch,microbatches,seq_len,device\ngpu,2,2,16,4,2,8,cuda\nafter,2,2,16,4,2,8,cpu\n' >"$work/gpu.csv"
if ! "$pipecheck" run --scenarios "$work/gpu.csv" --only gpu --out "$work/g" 2>&1 | grep -q "^\[1/1\] gpu *PASS"; then
  expect 1 "gpu +ERROR .*rank [01] exited with code 1; its last output: .*no CUDA device" "$pipecheck" run --scenarios "$work/gpu.csv" --out "$work/g"
  expect 0 "^gpu,ERROR,pass,0(,[^,]*){23},\"?rank [01] exited with code 1" tail -n +2 "$work/g/summary.csv"
  expect 0 "^after,PASS" tail -n 1 "$work/g/summary.csv"
fi
# compare: a report against itself is clean; halving one scenario's tokens/s is a regression.
expect 0 "0 regression\(s\)" "$pipecheck" compare "$work/r" "$work/r/summary.csv"
expect 0 "^scenario,verdict," head -n 1 "$work/r/compare.csv"
mkdir -p "$work/slow"
/usr/bin/python3 - "$work/r/summary.csv" "$work/slow/summary.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
rows[0]["pp_tokens_per_s"] = str(float(rows[0]["pp_tokens_per_s"]) / 2)
with open(sys.argv[2], "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=rows[0].keys())
    writer.writeheader()
    writer.writerows(rows)
PY
expect 1 "pp2 +REGRESSION.*tokens/s -50.0%" "$pipecheck" compare "$work/r" "$work/slow"
expect 2 "not a pipecheck summary: column 'scenario' is missing" "$pipecheck" compare "$work/good.csv" "$work/r"
expect 2 "cannot open" "$pipecheck" compare "$work/none" "$work/r"
expect 2 "max-slowdown" "$pipecheck" compare "$work/r" "$work/r" --max-slowdown 2
# An --out that cannot be written is bad input, found before anything runs.
expect 2 "pipecheck: " "$pipecheck" run --scenarios "$work/pp.csv" --out "$work/good.csv/sub"
expect 2 "not writable|Read-only|cannot" "$pipecheck" run --scenarios "$work/pp.csv" --out /proc/pipecheck-out
# worker: a missing torchrun environment is bad input.
expect 2 "RANK is not set" env -u RANK "$pipecheck" worker --scenarios "$work/pp.csv" --scenario pp2 --out "$work/w"
expect 2 "WORLD_SIZE is 3 but the scenario needs world_size 2" env RANK=0 WORLD_SIZE=3 "$pipecheck" worker --scenarios "$work/pp.csv" --scenario pp2 --out "$work/w"
# schedule: the chart and the bubble.
expect 0 "bubble: 0.4286 with F=1, B=2; 0.4286 with equal costs" "$pipecheck" schedule --schedule gpipe --stages 4 --microbatches 4
expect 0 "peak in-flight microbatches per rank: 4 3 2 1" "$pipecheck" schedule --schedule 1f1b --stages 4 --microbatches 8
expect 2 "schedule" "$pipecheck" schedule --schedule zigzag

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
