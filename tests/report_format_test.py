#!/usr/bin/env python3
"""The core suite's reports keep their format: every CSV's header, its rows in order, and every
cell that does not depend on the machine, against tests/data/core-reports/ (written with --update).

What varies from machine to machine is masked, so the check means the same everywhere: timings and
measured memory (`~`), and every real number (`#`, in cells and inside messages: another CPU's
BLAS rounds differently). Kept exactly: names, statuses, ok flags, fingerprints, configurations,
shapes, byte counts, the memory model's predictions, the planned messages, the action order. A
refactoring that changes a column, a row, a planned message or a prediction fails here, by name.
Usage: report_format_test.py PIPECHECK SOURCE_DIR WORKDIR [--update]
"""
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Timings and measured memory: different on every run.
MEASURED = {
    "summary.csv": {"ref_step_ms", "pp_step_ms", "ref_tokens_per_s", "pp_tokens_per_s", "ref_peak_bytes",
                    "pp_peak_bytes_max", "bubble_measured", "pp_step_ms_predicted", "wall_s",
                    "pp_tokens_per_s_spread", "message", "worst_param",
                    # how many steps were timed: the timing-only ones stop after 3 s at the step's pace
                    "pp_timed_steps"},
    "ranks.csv": {"peak_bytes", "busy_ms", "idle_ms", "comm_ms", "step_ms", "step_ms_predicted", "forward_ms",
                  "backward_ms", "input_grad_ms", "weight_grad_ms", "other_ms"},
    "timeline.csv": {"start_us", "end_us", "held_bytes", "wait_start_us", "step_start_us", "peak_bytes"},
    # Whether two tensors are bitwise equal depends on which kernels the machine's BLAS picks.
    "boundaries.csv": {"bitwise_equal"},
}
# Integers that follow from the configuration alone (everything else numeric is a real number).
EXACT_NUMBERS = {"step", "rank", "microbatch", "stage", "peer", "numel", "bytes", "order", "world_size",
                 "virtual_stages", "microbatches", "steps", "tokens", "params_checked", "params", "ok",
                 "pp_peak_bytes_predicted", "peak_bytes_predicted", "held_bytes_predicted",
                 "pp_tokens_per_s_runs"}
REAL = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
FILES = ["summary.csv", "steps.csv", "params.csv", "ranks.csv", "timeline.csv", "boundaries.csv", "comm.csv"]


def normalise(name, rows):
    header, out = rows[0], [rows[0]]
    masked = MEASURED.get(name, set())
    for row in rows[1:]:
        cells = []
        for column, cell in zip(header, row):
            if column in masked:
                cells.append("~")
            elif column in EXACT_NUMBERS or not REAL.fullmatch(cell):
                cells.append(cell if column in {"config", "planned", "shape"} or column in EXACT_NUMBERS
                             else REAL.sub("#", cell) if re.search(r"\d\.\d|\de-", cell) else cell)
            else:
                cells.append("#")
        out.append(cells)
    return out


def main():
    pipecheck, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    update = "--update" in sys.argv[4:]
    shutil.rmtree(work, ignore_errors=True)
    run = subprocess.run([pipecheck, "run", "--scenarios", str(source / "scenarios/core.csv"), "--out", str(work)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout + run.stderr)
        print("FAIL: the core suite did not pass")
        return 1
    golden = source / "tests/data/core-reports"
    failures = []
    for name in FILES:
        rows = normalise(name, list(csv.reader(open(work / name, newline=""))))
        if update:
            with open(golden / name, "w", newline="") as out:
                csv.writer(out, lineterminator="\n").writerows(rows)
            continue
        expected = list(csv.reader(open(golden / name, newline="")))
        if rows[0] != expected[0]:
            failures.append(f"{name}: header {rows[0]} != {expected[0]}")
            continue
        if len(rows) != len(expected):
            failures.append(f"{name}: {len(rows) - 1} rows, expected {len(expected) - 1}")
        for number, (got, want) in enumerate(zip(rows[1:], expected[1:]), start=2):
            if got != want:
                differing = [f"{column}: {w!r} -> {g!r}" for column, g, w in zip(rows[0], got, want) if g != w]
                failures.append(f"{name} line {number} ({got[0]}): " + "; ".join(differing))
                break  # the first differing row of each file is enough to read
    for failure in failures:
        print("FAIL:", failure)
    print(f"{'updated' if update else 'checked'} {len(FILES)} reports of the core suite"
          f"{'' if update else f': {len(failures)} differ'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
