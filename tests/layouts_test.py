#!/usr/bin/env python3
"""The production layouts of scenarios/layouts.csv: every row passes parity (every replica of the
data-parallel rows too, with bitwise-identical weights), and each recomputing row holds what
recomputation promises against its storing twin (the same name with `store_` for `recompute_`):
the scenario's measured peak (its largest rank's) at most the twin's, and every rank's within 10%
of the memory model's prediction. Rank by rank the ratio to the twin is printed: a rank that
holds one microbatch at a time (1F1B's last) saves nothing and may hold a few bytes more (the
recomputed loss). Peaks come from the counting allocator, not a clock: the same on every run.
Usage: layouts_test.py PIPECHECK SOURCE_DIR WORKDIR
"""
import csv
import shutil
import subprocess
import sys
from pathlib import Path


def main():
    pipecheck, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    run = subprocess.run([pipecheck, "run", "--scenarios", str(source / "scenarios/layouts.csv"), "--out", str(work)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout + run.stderr)
        print("FAIL: the layouts suite did not pass")
        return 1
    summary = {row["scenario"]: row for row in csv.DictReader(open(work / "summary.csv", newline=""))}
    ranks = {}
    for row in csv.DictReader(open(work / "ranks.csv", newline="")):
        ranks.setdefault(row["scenario"], []).append(row)
    failures, checked = [], 0
    for name, row in summary.items():
        if int(row["data_parallel"]) > 1:
            replicas = {r["replica"] for r in ranks[name]}
            if len(replicas) != int(row["data_parallel"]):
                failures.append(f"{name}: ranks.csv has replicas {sorted(replicas)}")
        if not name.startswith("recompute_"):
            continue
        twin = "store_" + name[len("recompute_"):]
        if twin not in summary:
            continue
        if row["recompute"] != "1" or summary[twin]["recompute"] != "0":
            failures.append(f"{name}: recompute column {row['recompute']}, twin {summary[twin]['recompute']}")
        peak, stored = int(row["pp_peak_bytes_max"]), int(summary[twin]["pp_peak_bytes_max"])
        print(f"{name}: peak {peak} B, storing twin {stored} B ({peak / stored:.2f}x)")
        if peak > stored:
            failures.append(f"{name}: recomputing peak {peak} B above the storing twin's {stored} B")
        for mine, theirs in zip(ranks[name], ranks[twin]):
            peak, predicted, stored = int(mine["peak_bytes"]), int(mine["peak_bytes_predicted"]), int(theirs["peak_bytes"])
            checked += 1
            where = f"{name} rank {mine['rank']}"
            print(f"{where}: peak {peak} B, predicted {predicted} B ({peak / predicted - 1:+.2%}), storing twin {stored} B "
                  f"({peak / stored:.2f}x)")
            if abs(peak - predicted) > 0.10 * predicted:
                failures.append(f"{where}: peak {peak} B is {peak / predicted - 1:+.1%} from the predicted {predicted} B")
    if checked == 0:
        failures.append("no recomputing rank was checked against a twin")
    for failure in failures:
        print("FAIL:", failure)
    print(f"{len(summary)} scenarios, {checked} recomputing ranks checked against their twins")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
