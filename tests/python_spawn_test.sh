#!/usr/bin/env bash
# A Python trainer's ranks forked by its fork server (trainers/fork_server.py) compute what ranks
# started by exec compute: the same verdicts and numbers, bit for bit, a control's caught corruption
# and ranks that exit with an error (a fault the adapter does not know: exit code 2) included; and
# the ranks were forked: the server's log (PIPECHECK_FORK_SERVER_LOG) names
# each rank it started, and under PIPECHECK_SPAWN=exec there is no server.
#
#     python_spawn_test.sh PIPECHECK PYTHON
set -euo pipefail
pipecheck="$1"
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$python" -c "import torch.distributed.pipelining" 2>/dev/null; then
  echo "python_spawn_test: $python has no torch.distributed.pipelining: skipped"
  exit 77
fi

cat >"$work/suite.csv" <<'CSV'
name,trainer,schedule,world_size,virtual_stages,layers,seq_len_min,batch,microbatches,dtype,steps,fault,expect
forked_1f1b,torch,1f1b,2,1,4,16,8,4,float64,2,none,pass
forked_zbv_varlen,torch,zbv,2,2,4,6,8,4,float32,2,none,pass
forked_control,torch,1f1b,2,1,4,16,8,4,float64,2,corrupt_activation,fail
forked_refused,torch,gpipe,2,1,4,16,8,4,float64,2,hang_rank,fail
CSV

numbers() {
  "$python" - "$1" <<'PY'
import csv, re, sys
for row in csv.DictReader(open(sys.argv[1])):
    # Which of two failing ranks ends first is a race, whichever way they start.
    message = re.sub(r"rank \d+ exited", "rank exited", row["message"].split(" (first exception")[0])
    message = re.sub(r" \(then rank\(s\) [0-9, ]+ failed too\)", "", message)
    print(row["scenario"], row["status"], row["loss_ref"], row["loss_pp"], row["loss_max_abs_diff"],
          row["grad_max_rel_err"], row["weights_max_rel_err"], message)
PY
}

export PIPECHECK_PYTHON="$python"
PIPECHECK_FORK_SERVER_LOG="$work/forked.log" "$pipecheck" run --scenarios "$work/suite.csv" --out "$work/forked" >/dev/null
PIPECHECK_SPAWN=exec PIPECHECK_FORK_SERVER_LOG="$work/execd.log" \
  "$pipecheck" run --scenarios "$work/suite.csv" --out "$work/execd" >/dev/null
forked=$(numbers "$work/forked/summary.csv")
execd=$(numbers "$work/execd/summary.csv")
echo "$forked"
if [ "$forked" != "$execd" ]; then
  echo "FAIL: ranks from the Python fork server and from exec differ:"
  diff <(echo "$forked") <(echo "$execd") || true
  exit 1
fi
[ "$(grep -c ' PASS ' <<<"$forked")" = 2 ] || { echo "FAIL: the two parity rows did not pass: $forked"; exit 1; }
grep -q '^forked_control FAIL ' <<<"$forked" || { echo "FAIL: the control was not caught: $forked"; exit 1; }
grep -q '^forked_refused ERROR .*no fault' <<<"$forked" || { echo "FAIL: the refused fault did not fail its row: $forked"; exit 1; }
# Four rows of two ranks each, all forked by one server; none under PIPECHECK_SPAWN=exec.
[ "$(grep -c 'torch_pipelining.py' "$work/forked.log")" = 8 ] || {
  echo "FAIL: the fork server did not start the eight ranks:"; cat "$work/forked.log"; exit 1; }
[ "$(grep -c '^server ' "$work/forked.log")" = 1 ] || {
  echo "FAIL: not one server for the run:"; cat "$work/forked.log"; exit 1; }
[ ! -s "$work/execd.log" ] || { echo "FAIL: PIPECHECK_SPAWN=exec still forked:"; cat "$work/execd.log"; exit 1; }
echo "python_spawn_test: passed"
