#!/usr/bin/env bash
# Ranks started by the run's fork server (harness/fork_server.h) compute what ranks started by
# fork and exec compute: the same verdicts and the same numbers, bit for bit; and a row's
# timed_steps holds unless `run --timed-steps` is given.
set -euo pipefail
pipecheck="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/suite.csv" <<'CSV'
name,layers,hidden,heads,tied,world_size,schedule,batch,microbatches,seq_len,seq_len_min,dtype,steps,timed_steps,data_parallel,clip
two_ranks_tied,3,32,4,1,2,1f1b,8,4,16,6,float64,2,3,1,0.01
two_replicas,4,32,4,0,2,zbh1,8,2,16,,float32,2,,2,0
CSV

# The numbers a rank computes, and (with a second argument) how many steps it timed: a row without
# timed_steps times as many as fit in its budget, which a loaded machine makes fewer, so the two
# spawn paths are compared on the numbers alone.
numbers() {
  python3 - "$@" <<'PY'
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    print(row["scenario"], row["status"], row["loss_ref"], row["loss_pp"], row["loss_max_abs_diff"],
          row["grad_max_rel_err"], row["weights_max_rel_err"], row["fingerprint"],
          *(["timed", row["pp_timed_steps"]] if len(sys.argv) > 2 else []))
PY
}

"$pipecheck" run --scenarios "$work/suite.csv" --out "$work/forked" >/dev/null
PIPECHECK_SPAWN=exec "$pipecheck" run --scenarios "$work/suite.csv" --out "$work/execd" >/dev/null
forked=$(numbers "$work/forked/summary.csv")
execd=$(numbers "$work/execd/summary.csv")
echo "$forked"
if [ "$forked" != "$execd" ]; then
  echo "FAIL: ranks from the fork server and from exec differ:"
  diff <(echo "$forked") <(echo "$execd") || true
  exit 1
fi
# The row's timed_steps (3) is what it timed; the other row times the run's default: 20 steps, as
# many as fit in 3 s at the row's pace, so a loaded machine may time fewer, but never the single
# judged step alone (that is --timed-steps 0, below).
forked=$(numbers "$work/forked/summary.csv" timed)
grep -q "^two_ranks_tied PASS .* timed 3$" <<<"$forked" || { echo "FAIL: two_ranks_tied did not time its 3 steps"; exit 1; }
grep -q "^two_replicas PASS .* timed \([2-9]\|1[0-9]\|20\)$" <<<"$forked" || {
  echo "FAIL: two_replicas did not time the run's default: $forked"; exit 1; }
# Given on the command line, --timed-steps holds for every row: 0 adds no timing-only step, so
# only the judged step after the warm-up is timed.
"$pipecheck" run --scenarios "$work/suite.csv" --out "$work/told" --timed-steps 0 >/dev/null
told=$(numbers "$work/told/summary.csv" timed)
[ "$(grep -c ' timed 1$' <<<"$told")" = 2 ] || { echo "FAIL: --timed-steps 0 did not hold for every row: $told"; exit 1; }
echo "spawn_test: passed"
