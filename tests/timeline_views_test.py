#!/usr/bin/env python3
"""trace.json and timeline.svg describe every executed action, once, on its rank, in order, on
one clock shared by the ranks (reports/trace.h). Parses both (JSON; SVG as XML) against
timeline.csv from real multi-process runs: the 4-rank 1F1B core scenario and a ZB-V one (I/W,
two stages per rank).

usage: timeline_views_test.py PIPECHECK SOURCE_DIR
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# On one host the ranks read one steady clock: a consumer may appear to start before its producer
# ended only by the time between the producer's end being read and its send (the timeline's
# resolution), never by a scheduler's slice.
SKEW_US = 500

RUNS = [("scenarios/core.csv", "ws4_m_less_than_p"), ("tests/data/parity.csv", "ws2_zbv_gpt2_tied")]

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def executed(timeline_csv, scenario):
    """Rows of timeline.csv for `scenario`, per rank in execution order: (step, name, start, end)."""
    per_rank = {}
    with open(timeline_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row["scenario"] != scenario:
                continue
            name = row["stage"] + row["action"] + row["microbatch"]
            base = float(row["step_start_us"])
            per_rank.setdefault(int(row["rank"]), []).append(
                (int(row["step"]), name, base + float(row["start_us"]), base + float(row["end_us"]),
                 base + float(row["wait_start_us"])))
    return per_rank


def check_trace(path, per_rank, steps, scenario):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    actions = {}
    waits = 0
    instants = 0
    for e in events:
        if e["ph"] == "X" and e["cat"] != "wait":
            actions.setdefault(e["tid"], []).append(e)
        elif e["ph"] == "X":
            waits += 1
            check(e["dur"] > 0, f"{scenario}: empty wait event {e}")
        elif e["ph"] == "i":
            instants += 1
    check(instants == steps, f"{scenario}: {instants} step markers, expected {steps}")
    check(sorted(actions) == sorted(per_rank), f"{scenario}: trace tracks {sorted(actions)} vs ranks {sorted(per_rank)}")
    for rank, rows in per_rank.items():
        got = [(e["args"]["step"], e["name"]) for e in sorted(actions.get(rank, []), key=lambda e: e["ts"])]
        want = [(step, name) for step, name, *_ in rows]
        check(got == want, f"{scenario}: rank {rank}'s trace events differ from timeline.csv: {got[:6]}... vs {want[:6]}...")
    # One clock: a forward that takes another rank's activation starts after that rank's forward ended.
    end_of = {}
    for rank, rows in per_rank.items():
        for step, name, start, end, _ in rows:
            end_of[(step, name)] = (rank, end)
    for rank, rows in per_rank.items():
        for step, name, start, end, _ in rows:
            stage, kind, mb = re.fullmatch(r"(\d+)([A-Z_]+)(\d+)", name).groups()
            if kind != "F" or int(stage) == 0:
                continue
            producer = end_of.get((step, f"{int(stage) - 1}F{mb}"))
            if producer and producer[0] != rank:
                check(start >= producer[1] - SKEW_US,
                      f"{scenario}: step {step} {name} on rank {rank} starts at {start:.0f} us, before "
                      f"{int(stage) - 1}F{mb} ended on rank {producer[0]} at {producer[1]:.0f} us: clocks not aligned")
    return waits


def check_svg(path, per_rank, scenario):
    root = ET.parse(path).getroot()
    check(root.tag == "{http://www.w3.org/2000/svg}svg", f"{scenario}: root element is {root.tag}")
    drawn = {}
    for rect in root.iter("{http://www.w3.org/2000/svg}rect"):
        if rect.get("class") == "action":
            drawn.setdefault(int(rect.get("data-rank")), []).append((int(rect.get("data-step")), rect.get("data-action")))
            check(float(rect.get("width")) > 0, f"{scenario}: zero-width rect {rect.attrib}")
    for rank, rows in per_rank.items():
        want = [(step, name) for step, name, *_ in rows]
        check(drawn.get(rank) == want, f"{scenario}: rank {rank}'s SVG rects differ from timeline.csv")
    steps = [l for l in root.iter("{http://www.w3.org/2000/svg}line") if l.get("class") == "step"]
    check(len(steps) == len({s for rows in per_rank.values() for s, *_ in rows}), f"{scenario}: step lines")


def main():
    pipecheck, source = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as out:
        for suite, scenario in RUNS:
            run = subprocess.run([pipecheck, "run", "--scenarios", os.path.join(source, suite), "--only", scenario,
                                  "--out", out], capture_output=True, text=True)
            if run.returncode != 0:
                failures.append(f"{scenario}: pipecheck run exited {run.returncode}: {run.stdout[-2000:]}{run.stderr}")
                continue
            per_rank = executed(os.path.join(out, "timeline.csv"), scenario)
            check(len(per_rank) >= 2, f"{scenario}: timeline has {len(per_rank)} ranks")
            steps = len({s for rows in per_rank.values() for s, *_ in rows})
            views = os.path.join(out, "views", scenario)
            waits = check_trace(os.path.join(views, "trace.json"), per_rank, steps, scenario)
            check_svg(os.path.join(views, "timeline.svg"), per_rank, scenario)
            print(f"{scenario}: {sum(len(r) for r in per_rank.values())} actions on {len(per_rank)} ranks, "
                  f"{waits} waits, {steps} steps: trace.json and timeline.svg agree with timeline.csv")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
