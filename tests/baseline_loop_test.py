#!/usr/bin/env python3
"""The baseline loop on this machine, as CI runs it: record a runner's baseline from three runs
(`baseline update --from R1 --from R2 --from R3 --runner NAME`), then `run --runner NAME`: an
unchanged rerun must pass, and the same scenario on a runner whose cores are busy with other work
(one spinning process per core: the same configuration, slower) must fail as a throughput
regression. A scenario with fault slow_steps (every step 25% longer) is another configuration,
which `compare` refuses to rate against the baseline (CHANGED); its numbers stay right.

Timing on a shared machine: CTest runs this alone (RUN_SERIAL). The scenario is the throughput
suite's quietest (scenarios/throughput.csv: twelve ~0.1 s steps, median of eleven).
Usage: baseline_loop_test.py PIPECHECK SOURCE_DIR WORKDIR
"""
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

pipecheck, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
suite = source / "scenarios/throughput.csv"
scenario = "tp_ws2_gpipe_gpt2_f32"
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def run(*args):
    result = subprocess.run([pipecheck, *args], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


baselines = work / "baselines"
runs = []
for i in range(3):
    out = work / f"r{i}"
    code, output = run("run", "--scenarios", str(suite), "--only", scenario, "--out", str(out))
    check(code == 0, f"baseline run {i}: exit {code}\n{output}")
    runs.append(out)
code, output = run("baseline", "update", "--baseline-dir", str(baselines), "--runner", "test-runner",
                   *[arg for out in runs for arg in ("--from", str(out))])
check(code == 0, f"baseline update: exit {code}\n{output}")
recorded = rows(baselines / "test-runner/summary.csv")
rates = sorted(float(rows(out / "summary.csv")[0]["pp_tokens_per_s"]) for out in runs)
check(len(recorded) == 1 and recorded[0]["pp_tokens_per_s_runs"] == "3", f"baseline: three runs merged: {recorded}")
check(abs(float(recorded[0]["pp_tokens_per_s"]) - rates[2]) < 1e-6 * rates[2], "baseline: the fastest run's tokens/s")
spread = float(recorded[0]["pp_tokens_per_s_spread"])
# Robust: 1.4826 x the median absolute deviation of the runs' tokens/s, or their own spreads'
# median (each over its timed steps), whichever is larger.
between = 1.4826 * sorted(abs(r - rates[1]) for r in rates)[1] / rates[1]
within = sorted(float(rows(out / "summary.csv")[0]["pp_tokens_per_s_spread"]) for out in runs)[1]
check(abs(spread - max(between, within)) < 1e-9, f"baseline: spread max({between}, {within}): {spread}")
print(f"baseline: tokens/s {rates} -> fastest {rates[2]:.0f}, spread {100 * spread:.1f}%")

code, output = run("run", "--scenarios", str(suite), "--only", scenario, "--out", str(work / "again"),
                   "--baseline-dir", str(baselines), "--runner", "test-runner")
again = rows(work / "again/compare.csv")
print(f"unchanged rerun: exit {code}, tokens/s {again[0]['throughput_change']} (limit {again[0]['throughput_limit']})")
check(code == 0 and again[0]["verdict"] == "ok", f"unchanged rerun: exit {code}\n{output}")

# The unchanged configuration on a busy runner: one spinning process per core.
spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
try:
    code, output = run("run", "--scenarios", str(suite), "--only", scenario, "--out", str(work / "busy"),
                       "--baseline-dir", str(baselines), "--runner", "test-runner")
finally:
    for spinner in spinners:
        spinner.kill()
        spinner.wait()
busy = rows(work / "busy/compare.csv")
print(f"busy-runner rerun: exit {code}, tokens/s {busy[0]['throughput_change']} (limit {busy[0]['throughput_limit']})")
check(code == 1 and busy[0]["verdict"] == "REGRESSION" and busy[0]["notes"].startswith("tokens/s -"),
      f"a busy runner: a throughput regression, exit 1: {busy}\n{output}")

slow_suite = work / "slow.csv"
lines = [l for l in suite.read_text().splitlines() if l and not l.startswith("#")]
slow_suite.write_text("\n".join([lines[0] + ",fault"] + [l + ",slow_steps" for l in lines[1:]]) + "\n")
code, output = run("run", "--scenarios", str(slow_suite), "--only", scenario, "--out", str(work / "slow"),
                   "--baseline-dir", str(baselines), "--runner", "test-runner")
slow = rows(work / "slow/compare.csv")
print(f"slow_steps rerun: exit {code}, verdict {slow[0]['verdict']}")
check(code == 1 and slow[0]["verdict"] == "CHANGED", f"slow_steps is another configuration: CHANGED, exit 1: {slow}")
check(rows(work / "slow/summary.csv")[0]["status"] == "PASS", "slow_steps leaves every number right: parity passes")

for failure in failures:
    print("FAIL:", failure)
print(f"{len(failures)} problem(s)")
sys.exit(1 if failures else 0)
