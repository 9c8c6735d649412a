#!/usr/bin/env python3
"""Replays compare's tokens/s gate over recorded runs of one suite, to size its rule.

    scripts/gating.py collect --runs 10 --out /tmp/gating [-- extra `pipecheck run` options]
    scripts/gating.py replay /tmp/gating/run*            # every run folder holds a summary.csv

`collect` runs the suite N times (one after another, nothing else should run beside it).
`replay` takes every baseline of three runs merged as `baseline update` merges them, against
every other run as the current one and a third run as the second timing `run --runner` takes
when tokens/s is a row's only regression, and counts:

  - false alarms: the current run as measured, flagged;
  - detections: the current run (and its second timing) scaled by 0.7 and 0.5 (a uniform
    slowdown), flagged; the 30% figure counts only rows whose run took at least 1 s (wall_s).

for each baseline estimator (the median run, as compare has merged since spreads came in, and
the fastest run) and each cap. The limit is compare's: max(10%, 3 x spread) capped, the spread
the larger of the runs' robust spread and the median of their timed steps' spreads.
"""
import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def robust_spread(values):
    if len(values) < 2:
        return float("nan")
    median = statistics.median(values)
    deviation = statistics.median(abs(v - median) for v in values)
    return 1.4826 * deviation / median if median > 0 else float("nan")


def read_run(folder):
    rows = {}
    with open(os.path.join(folder, "summary.csv"), newline="") as stream:
        for row in csv.DictReader(stream):
            if row["status"] != "PASS" or not row["pp_tokens_per_s"]:
                continue
            spread = row.get("pp_tokens_per_s_spread") or "nan"
            rows[row["scenario"]] = (float(row["pp_tokens_per_s"]), float(spread), float(row["wall_s"] or 0))
    return rows


def merged(runs, name, estimator):
    rates = [run[name][0] for run in runs]
    withins = [run[name][1] for run in runs if run[name][1] == run[name][1]]
    between = robust_spread(rates)
    within = statistics.median(withins) if withins else float("nan")
    spread = max(s for s in (between, within) if s == s) if (between == between or within == within) else float("nan")
    base = statistics.median(rates) if estimator == "median" else max(rates)
    return base, spread


def flagged(base, spread, cap, first, second):
    limit = min(cap, max(0.10, 3.0 * spread))
    if first / base - 1.0 >= -limit:
        return False
    return max(first, second) / base - 1.0 < -limit


def replay(folders):
    runs = [read_run(folder) for folder in folders]
    names = sorted(set.intersection(*(set(run) for run in runs)))
    if len(runs) < 5:
        sys.exit("replay: needs at least 5 runs (3 for a baseline, a current run and a second timing)")
    rules = [(estimator, cap) for estimator in ("median", "fastest") for cap in (0.15, 0.20, 0.25)]
    print(f"{len(runs)} runs, {len(names)} rows gated in all of them")
    for estimator, cap in rules:
        alarms = total = 0
        caught = {0.7: [0, 0], 0.5: [0, 0]}
        missed_by_row = {}
        for name in names:
            long_row = statistics.median(run[name][2] for run in runs) >= 1.0
            for trio in itertools.combinations(range(len(runs)), 3):
                base, spread = merged([runs[i] for i in trio], name, estimator)
                others = [i for i in range(len(runs)) if i not in trio]
                for current, second in itertools.permutations(others, 2):
                    now, again = runs[current][name][0], runs[second][name][0]
                    total += 1
                    alarms += flagged(base, spread, cap, now, again)
                    for factor in caught:
                        if factor == 0.7 and not long_row:
                            continue
                        hit = flagged(base, spread, cap, now * factor, again * factor)
                        caught[factor][0] += hit
                        caught[factor][1] += 1
                        if factor == 0.7 and not hit:
                            missed_by_row[name] = missed_by_row.get(name, 0) + 1
        misses = ", ".join(f"{n} {k}" for n, k in sorted(missed_by_row.items(), key=lambda x: -x[1])) or "none"
        print(f"baseline={estimator:7s} cap={cap:.0%}: false alarms {alarms}/{total} ({alarms / total:.3%}); "
              f"30% caught {caught[0.7][0]}/{caught[0.7][1]} ({caught[0.7][0] / max(1, caught[0.7][1]):.1%}) on rows "
              f">= 1 s; 50% caught {caught[0.5][0]}/{caught[0.5][1]}; 30% misses: {misses}")
    print("\nper row: median tokens/s over runs, robust run-to-run spread, median within-run spread, "
          "fastest/median")
    for name in names:
        rates = [run[name][0] for run in runs]
        withins = [run[name][1] for run in runs]
        print(f"  {name:32s} {statistics.median(rates):10.0f} {robust_spread(rates):7.1%} "
              f"{statistics.median(withins):7.1%} {max(rates) / statistics.median(rates):6.3f}")


def collect(count, out, extra):
    binary = os.path.join(ROOT, "build", "pipecheck")
    for index in range(count):
        folder = os.path.join(out, f"run{index:02d}")
        command = [binary, "run", "--scenarios", os.path.join(ROOT, "scenarios", "core.csv"), "--out", folder] + extra
        print(" ".join(command), flush=True)
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit(f"collect: run {index} failed (see {folder})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    take = commands.add_parser("collect")
    take.add_argument("--runs", type=int, default=10)
    take.add_argument("--out", required=True)
    take.add_argument("extra", nargs="*")
    again = commands.add_parser("replay")
    again.add_argument("folders", nargs="+")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.runs, args.out, args.extra)
    else:
        replay(args.folders)


if __name__ == "__main__":
    main()
