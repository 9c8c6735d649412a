#!/usr/bin/env python3
"""Mutation testing of the verifier: plants each one-line bug of tests/mutants/pipeline.txt in
pipeline/, rebuilds pipecheck incrementally, runs the default suite (`pipecheck run`, as `make run`
does) against it, and always puts the file back. One line per mutant: caught or missed, and the
first message of the first scenario that did not meet its expectation. Then the kill rate over
the mutants not marked equivalent, and every survivor.

Usage: mutants.py [--build DIR] [--only ID,...] [--list FILE] [--timeout S]
Exit: 0 when every mutant not marked equivalent was caught, 1 otherwise, 2 on bad input (a
`find` that is not in its file exactly once, a broken list, a build that fails unmutated).
"""
import argparse
import csv
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
FIELDS = ("id", "file", "find", "replace", "bug", "equivalent")


def parse(path):
    """The blocks of a mutant list; a line that starts with a space continues the field above it."""
    mutants, current, field = [], {}, None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                mutants.append(current)
            current, field = {}, None
            continue
        if line.startswith(" ") and field:
            current[field] += "\n" + line
            continue
        key, sep, value = line.partition(": ")
        if not sep or key not in FIELDS:
            raise SystemExit(f"{path}:{number}: expected 'FIELD: value' with FIELD one of {', '.join(FIELDS)}: {line!r}")
        field = key
        current[key] = value
    if current:
        mutants.append(current)
    seen = set()
    for m in mutants:
        for key in ("id", "file", "find", "replace", "bug"):
            if key not in m:
                raise SystemExit(f"{path}: mutant {m.get('id', '?')} has no '{key}'")
        if m["id"] in seen:
            raise SystemExit(f"{path}: mutant id {m['id']} appears twice")
        seen.add(m["id"])
        text = (SOURCE / m["file"]).read_text()
        if text.count(m["find"]) != 1:
            raise SystemExit(f"{path}: mutant {m['id']}: its find text occurs {text.count(m['find'])} times in "
                             f"{m['file']} (it must occur once)")
    return mutants


def build(directory, log):
    return subprocess.run(["cmake", "--build", str(directory), "--target", "pipecheck", "-j2"], stdout=log,
                          stderr=subprocess.STDOUT).returncode == 0


def first_failure(out):
    """The first scenario that did not meet its expectation, and its message."""
    summary = out / "summary.csv"
    if not summary.exists():
        return ""  # nothing ran (the suite was refused at load): the caller quotes pipecheck's own words
    for row in csv.DictReader(open(summary, newline="")):
        if row.get("ok") != "1":
            return f"{row['scenario']}: {row['status']}: {row['message'][:200]}"
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=str(SOURCE / "build"))
    parser.add_argument("--only", default="")
    parser.add_argument("--list", default=str(SOURCE / "tests/mutants/pipeline.txt"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--check", action="store_true",
                        help="only check the list: every find text once in its file (no build, no run)")
    args = parser.parse_args()
    mutants = parse(Path(args.list))
    if args.check:
        print(f"{args.list}: {len(mutants)} mutants, each find text once in its file")
        return 0
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m["id"] for m in mutants}
        if unknown:
            raise SystemExit(f"--only: no mutant {', '.join(sorted(unknown))} in {args.list}")
        mutants = [m for m in mutants if m["id"] in wanted]
    build_dir = Path(args.build)
    pipecheck = build_dir / "pipecheck"
    work = Path(tempfile.mkdtemp(prefix="pipecheck_mutants_"))
    log = open(work / "build.log", "w")
    if not build(build_dir, log):
        print(f"the unmutated build fails: {work / 'build.log'}")
        return 2
    # Whatever happens (an interrupt included), every file goes back as it was, and the build with it.
    originals = {}

    def restore():
        for path, text in originals.items():
            path.write_text(text)
        originals.clear()

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results = []
    width = max(len(m["id"]) for m in mutants)
    try:
        for m in mutants:
            path = SOURCE / m["file"]
            text = path.read_text()
            originals[path] = text
            path.write_text(text.replace(m["find"], m["replace"], 1))
            start = time.monotonic()
            if not build(build_dir, log):
                verdict, message = "unbuildable", "the mutant does not compile (see build.log)"
            else:
                out = work / m["id"]
                shutil.rmtree(out, ignore_errors=True)
                try:
                    run = subprocess.run([str(pipecheck), "run", "--out", str(out)], cwd=SOURCE, capture_output=True,
                                         text=True, timeout=args.timeout)
                    caught = run.returncode != 0
                    message = first_failure(out) if caught else ""
                    if caught and not message:
                        lines = [line for line in (run.stdout + run.stderr).strip().splitlines() if line.strip()]
                        message = lines[-1][:300] if lines else f"exit {run.returncode}"
                except subprocess.TimeoutExpired:
                    caught, message = True, f"the suite ran past {args.timeout:g} s"
                verdict = "caught" if caught else "missed"
            restore()
            seconds = time.monotonic() - start
            equivalent = " ".join(m.get("equivalent", "").split())  # prose: continuation lines joined
            shown = verdict + (" (equivalent)" if equivalent else "")
            print(f"{m['id']:<{width}}  {shown:<20} {seconds:5.0f} s  {message or equivalent}", flush=True)
            results.append((m, verdict))
    except KeyboardInterrupt:
        restore()
        build(build_dir, log)
        print("interrupted: every file restored")
        return 130
    finally:
        restore()
    build(build_dir, log)  # the build as the sources are
    counted = [(m, v) for m, v in results if not m.get("equivalent") and v != "unbuildable"]
    killed = sum(1 for _, v in counted if v == "caught")
    survivors = [m for m, v in counted if v == "missed"]
    rate = killed / len(counted) if counted else 0.0
    print(f"\n{len(results)} mutants: {killed} of {len(counted)} not marked equivalent caught ({rate:.0%}); "
          f"{sum(1 for m, _ in results if m.get('equivalent'))} marked equivalent; "
          f"{sum(1 for _, v in results if v == 'unbuildable')} unbuildable; reports in {work}")
    for m in survivors:
        print(f"  survived: {m['id']} ({m['file']}): {m['bug']}")
    return 0 if not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
