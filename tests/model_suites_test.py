#!/usr/bin/env python3
"""The model suites on pipecheck's own trainer: scenarios/gqa.csv (grouped-query attention) and
scenarios/moe.csv (mixture of experts with the balance loss), each row PASS in float64, and on every
MoE row with a balance loss its own parity in summary.csv (aux_loss_ref, aux_loss_pp,
aux_loss_max_rel_err within the row's tol); empty where there is none. Then scenarios/routing.csv:
choices perturbed within rounding taken from the pipeline (routing_adopted > 0) and passing.

    model_suites_test.py PIPECHECK SOURCE_DIR WORK_DIR
"""
import csv
import subprocess
import sys
from pathlib import Path


def run(pipecheck, suite, out):
    done = subprocess.run([pipecheck, "run", "--scenarios", str(suite), "--out", str(out)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        print(done.stdout[-4000:] + done.stderr[-4000:])
        return None
    return list(csv.DictReader(open(out / "summary.csv", newline="")))


def main():
    pipecheck, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    failures = []
    for name in ("gqa", "moe"):
        rows = run(pipecheck, source / "scenarios" / f"{name}.csv", work / name)
        if rows is None:
            failures.append(f"scenarios/{name}.csv: pipecheck run did not exit 0")
            continue
        suite = {r["name"]: r for r in csv.DictReader(
            line for line in open(source / "scenarios" / f"{name}.csv") if not line.startswith("#"))}
        for row in rows:
            if row["status"] != "PASS":
                failures.append(f"{row['scenario']}: {row['status']}: {row['message']}")
            spec = suite[row["scenario"]]
            balanced = int(spec.get("experts") or 0) >= 2 and float(spec.get("aux_loss") or 0.01) > 0
            aux = (row["aux_loss_ref"], row["aux_loss_pp"], row["aux_loss_max_rel_err"])
            if not balanced:
                if any(aux):
                    failures.append(f"{row['scenario']}: balance-loss columns {aux} on a row without one")
                continue
            if not all(aux):
                failures.append(f"{row['scenario']}: balance-loss columns empty: {aux}")
            elif not (float(aux[0]) > 0 and float(aux[2]) <= 1e-9):
                failures.append(f"{row['scenario']}: balance loss {aux[0]} vs {aux[1]}, rel err {aux[2]}")
        print(f"scenarios/{name}.csv: {len(rows)} rows")
    # Routing within rounding: a perturbation of the choices within the tolerance passes with the
    # pipeline's choices taken (routing_adopted > 0); without it none is taken; a router bug fails.
    rows = run(pipecheck, source / "scenarios" / "routing.csv", work / "routing")
    if rows is None:
        failures.append("scenarios/routing.csv: pipecheck run did not exit 0")
    else:
        suite = {r["name"]: r for r in csv.DictReader(
            line for line in open(source / "scenarios" / "routing.csv") if not line.startswith("#"))}
        for row in rows:
            fault, adopted = suite[row["scenario"]]["fault"], row["routing_adopted"]
            if fault == "router_choice_rounding" and not (row["status"] == "PASS" and int(adopted or 0) > 0):
                failures.append(f"{row['scenario']}: {row['status']} with routing_adopted {adopted!r}: the "
                                f"perturbed choices must be taken and the row pass: {row['message']}")
            if fault == "none" and not (row["status"] == "PASS" and adopted == "0"):
                failures.append(f"{row['scenario']}: {row['status']}, routing_adopted {adopted!r}")
            if suite[row["scenario"]]["expect"] == "fail" and row["status"] != "FAIL":
                failures.append(f"{row['scenario']}: {row['status']}: the router bug must be caught")
        print(f"scenarios/routing.csv: {len(rows)} rows, "
              f"{sum(int(r['routing_adopted'] or 0) for r in rows)} choices taken within rounding")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
