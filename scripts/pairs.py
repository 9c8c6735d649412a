#!/usr/bin/env python3
"""Pairwise (all-pairs) coverage of pipecheck's own trainer's feature axes.

    scripts/pairs.py axes                         # the axes and their values
    scripts/pairs.py supported [--seed S]         # which pairs the loader takes, and why not the rest
    scripts/pairs.py check SUITE.csv [--seed S]   # the supported pairs SUITE's rows leave uncovered
    scripts/pairs.py generate [--seed S] [--keep SUITE.csv] [--out FILE]

The axes are written down once (AXES). Which pairs of values can go together is not restated
here: candidate rows are built from the axes (`build`), handed to the real loader
(`pipecheck validate --each`, one verdict a row), and a pair is supported when some row the
loader takes has both values, as `classify` reads them back from the row itself (tied weights'
placement, an empty stage, the stages per rank are what the row does, not what was asked). A
pair no candidate could carry is listed with the loader's refusal of one that tried.

`generate` builds a covering array: greedily, from the pool of valid candidates, the row that
covers the most pairs still uncovered (the smallest first among equals: fewer processes, fewer
stages), until every supported pair is covered; `--keep` starts from a suite's rows. Seeded and
reproducible: the same seed and axes give the same rows.
"""
import argparse
import csv
import io
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECHECK = os.environ.get("PIPECHECK", os.path.join(ROOT, "build", "pipecheck"))

# The feature axes of pipecheck's own trainer. Bucketed axes: world_size 4 means 4 or more,
# stages_per_rank 3 and data_parallel 3 likewise.
AXES = {
    "flavor": ["llama", "gpt2"],
    "schedule": ["gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev", "loopedbfs", "csv"],
    "world_size": [1, 2, 3, 4],
    "stages_per_rank": [1, 2, 3],
    "tied": ["none", "one_rank", "two_ranks"],
    "clip": ["off", "on"],
    "dtype": ["float64", "float32", "bfloat16"],
    "varlen": [0, 1],
    "empty_stage": [0, 1],
    "partition": ["uniform", "params", "explicit"],
    "data_parallel": [1, 2, 3],
    "recompute": [0, 1],
    "accumulation": [1, 3],
    "optimizer": ["adamw", "sgd"],
    "loss": ["tokens", "microbatch_mean"],
}

COLUMNS = ["name", "flavor", "layers", "hidden", "heads", "tied", "world_size", "schedule", "partition", "batch",
           "microbatches", "seq_len", "seq_len_min", "dtype", "steps", "optimizer", "lr", "clip", "recompute",
           "data_parallel", "virtual_stages", "accumulation", "loss"]

# The schedules of scenarios/schedules/ a `csv` row can name: (ranks, stages per rank) -> file, microbatches.
CSV_SCHEDULES = {(2, 1): ("schedules/zbh1_p2_m4.csv", 4), (2, 2): ("schedules/zbv_p2_m4.csv", 4),
                 (4, 1): ("schedules/1f1b_p4_m8_comms.csv", 8)}
V_SCHEDULES = {"zbv", "dualpipev"}
DEFAULT_STAGES = {"interleaved": 2, "zbv": 2, "dualpipev": 2, "loopedbfs": 2}


def is_v_csv(path, ranks):
    """A CSV schedule with two stages per rank is a V when stage p runs on rank p - 1."""
    try:
        with open(path, newline="") as stream:
            rows = list(csv.reader(stream))
    except OSError:
        return False
    for rank, row in enumerate(rows):
        for cell in row:
            match = re.match(r"\(?(\d+)F", cell.strip())
            if match and int(match.group(1)) == ranks:
                return rank == ranks - 1
    return False


def classify(row, suite_dir):
    """The axis values a suite row has, from its columns (empty cells take the loader's defaults)."""
    get = lambda column, default: row.get(column) or default
    schedule = get("schedule", "1f1b")
    family = "csv" if schedule.startswith("csv:") else schedule
    ranks = int(get("world_size", 2))
    stages = int(get("virtual_stages", DEFAULT_STAGES.get(family, 1)))
    total = ranks * stages
    layers = int(get("layers", 4))
    partition = get("partition", "uniform")
    rule = partition if partition in ("uniform", "params") else "explicit"
    empty = (rule == "explicit" and "0" in partition.split(";")) or (rule != "explicit" and layers < total)
    v_shaped = family in V_SCHEDULES or (
        family == "csv" and stages == 2 and is_v_csv(os.path.join(suite_dir, schedule[4:]), ranks))
    last_rank = 0 if v_shaped else (total - 1) % ranks
    tied = "none" if get("tied", "0") == "0" else ("one_rank" if last_rank == 0 else "two_ranks")
    seq_len = int(get("seq_len", 32))
    return {
        "flavor": get("flavor", "llama"), "schedule": family, "world_size": min(ranks, 4),
        "stages_per_rank": min(stages, 3), "tied": tied, "clip": "off" if float(get("clip", 0)) == 0 else "on",
        "dtype": get("dtype", "float64"), "varlen": int(int(get("seq_len_min", seq_len)) < seq_len),
        "empty_stage": int(empty), "partition": rule, "data_parallel": min(int(get("data_parallel", 1)), 3),
        "recompute": int(get("recompute", 0)), "accumulation": 1 if int(get("accumulation", 1)) == 1 else 3,
        "optimizer": get("optimizer", "adamw"), "loss": get("loss", "tokens"),
    }


def build(a):
    """A tiny row asking for the axis values `a`, or None where this builder has no way to."""
    ranks, stages = a["world_size"], a["stages_per_rank"]
    total = ranks * stages
    microbatches = 2 * ranks if a["schedule"] == "dualpipev" else max(2, ranks)
    schedule = a["schedule"]
    if schedule == "csv":
        if (ranks, stages) not in CSV_SCHEDULES:
            return None
        path, microbatches = CSV_SCHEDULES[(ranks, stages)]
        schedule = "csv:" + path
    if a["empty_stage"]:
        if total < 2:
            return None
        layers = total - 1
        per_stage = [1] * total
        per_stage[total // 2] = 0
    else:
        layers = total + 1
        per_stage = [2] + [1] * (total - 1)
    partition = ";".join(map(str, per_stage)) if a["partition"] == "explicit" else a["partition"]
    batch = 2 * microbatches * a["data_parallel"] * a["accumulation"]
    return {
        "flavor": a["flavor"], "layers": layers, "hidden": 32, "heads": 4, "tied": int(a["tied"] != "none"),
        "world_size": ranks, "schedule": schedule, "partition": partition, "batch": batch,
        "microbatches": microbatches, "seq_len": 16, "seq_len_min": 6 if a["varlen"] else "", "dtype": a["dtype"],
        "steps": 2, "optimizer": a["optimizer"], "lr": "0.1" if a["optimizer"] == "sgd" else "1e-3",
        "clip": "0.01" if a["clip"] == "on" else "0", "recompute": a["recompute"],
        "data_parallel": a["data_parallel"], "virtual_stages": stages, "accumulation": a["accumulation"],
        "loss": a["loss"],
    }


def pairs_of(values):
    names = list(AXES)
    return {((x, values[x]), (y, values[y])) for x, y in itertools.combinations(names, 2)}


def all_pairs():
    names = list(AXES)
    return {((x, u), (y, w)) for x, y in itertools.combinations(names, 2) for u in AXES[x] for w in AXES[y]}


def validate(rows, suite_dir):
    """The loader's verdict on each row: None where it takes it, else its message."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for index, row in enumerate(rows):
        writer.writerow(dict(row, name=f"candidate_{index:05d}"))
    with tempfile.NamedTemporaryFile("w", suffix=".csv", dir=suite_dir, prefix=".pairs-", delete=False) as probe:
        probe.write(text.getvalue())
    try:
        out = subprocess.run([PIPECHECK, "validate", "--each", "--scenarios", probe.name], capture_output=True,
                             text=True)
    finally:
        os.unlink(probe.name)
    verdicts = {}
    for line in out.stdout.splitlines():
        match = re.match(re.escape(probe.name) + r":(\d+):(?:\d+:)? ?(.*)", line)
        if match:
            verdicts[int(match.group(1)) - 2] = None if match.group(2) == "valid" else match.group(2)
    if len(verdicts) != len(rows):
        sys.exit(f"pairs: pipecheck validate --each gave {len(verdicts)} verdicts for {len(rows)} rows:\n"
                 f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return [verdicts[i] for i in range(len(rows))]


def pool(seed, suite_dir, per_pair=4):
    """Valid candidate rows (with their axis values) and, per pair no valid row has, a refusal."""
    rng = random.Random(seed)
    names = list(AXES)
    asked, rows = [], []
    seen = set()
    for (x, u), (y, w) in sorted(all_pairs(), key=str):
        for _ in range(per_pair):
            a = {name: rng.choice(AXES[name]) for name in names}
            a[x], a[y] = u, w
            row = build(a)
            key = None if row is None else tuple(sorted(row.items()))
            asked.append((((x, u), (y, w)), key is not None and key not in seen, row))
            if row is not None and key not in seen:
                seen.add(key)
                rows.append(row)
    verdicts = validate(rows, suite_dir)
    valid = [(row, classify(row, suite_dir)) for row, verdict in zip(rows, verdicts) if verdict is None]
    supported = set().union(*(pairs_of(values) for _, values in valid))
    refusal = {}
    by_row = {id(row): verdict for row, verdict in zip(rows, verdicts)}
    for pair, _, row in asked:
        if pair in supported or row is None or id(row) not in by_row:
            continue
        if by_row[id(row)] is None:  # taken, but the row does something else than was asked
            values = classify(row, suite_dir)
            said = ", ".join(f"{axis}={values[axis]}" for axis, _ in pair)
            refusal[pair] = f"the loader takes rows asking for it, and they are read back as {said}"
        else:
            refusal.setdefault(pair, "the loader: " + by_row[id(row)])
    for pair, _, row in asked:
        if pair not in supported:
            refusal.setdefault(pair, "this builder makes no row of it (scenarios/schedules/ has no such CSV schedule)")
    for pair in all_pairs() - supported:
        refusal.setdefault(pair, "no candidate carried it")
    return valid, supported, refusal


def read_suite(path):
    with open(path, newline="") as stream:
        lines = [line for line in stream if line.strip() and not line.lstrip().startswith("#")]
    return list(csv.DictReader(lines))


def counted(row):
    return (row.get("trainer") or "pipecheck") == "pipecheck" and (row.get("fault") or "none") == "none"


def show(pair):
    return f"{pair[0][0]}={pair[0][1]} x {pair[1][0]}={pair[1][1]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["axes", "supported", "check", "generate"])
    parser.add_argument("suite", nargs="?")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="generate: start from this suite's rows")
    parser.add_argument("--out", help="generate: write the rows here (default stdout)")
    args = parser.parse_args()
    if args.command == "axes":
        for name, values in AXES.items():
            print(f"{name}: {', '.join(map(str, values))}")
        return 0
    suite_dir = os.path.join(ROOT, "scenarios")
    valid, supported, refusal = pool(args.seed, suite_dir)
    print(f"{len(all_pairs())} pairs of axis values; {len(supported)} supported (a candidate the loader takes has "
          f"them), {len(refusal)} not", file=sys.stderr)
    if args.command == "supported":
        for pair in sorted(refusal, key=str):
            print(f"unsupported: {show(pair)}: {refusal[pair]}")
        return 0
    if args.command == "check":
        rows = [row for row in read_suite(args.suite) if counted(row)]
        covered = set().union(*(pairs_of(classify(row, os.path.dirname(os.path.abspath(args.suite))))
                                for row in rows))
        missing = sorted(supported - covered, key=str)
        print(f"{args.suite}: {len(rows)} rows of pipecheck's trainer cover {len(supported & covered)} of "
              f"{len(supported)} supported pairs; {len(missing)} uncovered")
        for pair in missing:
            print(f"uncovered: {show(pair)}")
        return 1 if missing else 0
    kept = [row for row in read_suite(args.keep) if counted(row)] if args.keep else []
    kept_dir = os.path.dirname(os.path.abspath(args.keep)) if args.keep else suite_dir
    covered = set().union(set(), *(pairs_of(classify(row, kept_dir)) for row in kept))
    chosen = []
    cost = lambda row: (row["world_size"] * row["data_parallel"], row["virtual_stages"], row["accumulation"])
    while supported - covered:
        best = max(valid, key=lambda c: (len(pairs_of(c[1]) - covered), [-x for x in cost(c[0])]))
        chosen.append(best)
        covered |= pairs_of(best[1])
    out = open(args.out, "w") if args.out else sys.stdout
    # CSV schedules are named relative to the suite that names them: to wherever it is written.
    where = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for index, (row, values) in enumerate(chosen):
        schedule = row["schedule"]
        if schedule.startswith("csv:"):
            schedule = "csv:" + os.path.relpath(os.path.join(suite_dir, schedule[4:]), where)
        writer.writerow(dict(row, schedule=schedule,
                             name=f"pairs_{index:02d}_{values['schedule']}_p{row['world_size']}"))
    print(f"{len(chosen)} rows cover the {len(supported)} supported pairs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
