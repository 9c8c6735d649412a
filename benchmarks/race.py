#!/usr/bin/env python3
"""pipecheck's trainer against PyTorch's pipelining (trainer=torch) on identical work: each
`NAME_torch` row of the suite against its twin `NAME`, alternated over rounds as
shared/MEASURING.md asks (who goes first swaps every round), every run judged by pipecheck against
the reference (a run that does not PASS ends the race). Prints, per pair, the median tokens/s and
peak tensor bytes of each trainer with their ranges over the rounds, and the ratios of medians.
Both trainers are measured the same way: a step lasts as long as the slowest rank's, tokens/s is
over the median step after the warm-up, peak bytes are the counting allocator's (CPU) or the CUDA
caching allocator's, largest over the ranks.

    benchmarks/race.py --pipecheck build/pipecheck --scenarios benchmarks/peer.csv --rounds 5 --threads 1
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile


def run(pipecheck, suite, name, threads, out, device):
    command = [pipecheck, "run", "--scenarios", suite, "--only", name, "--threads", str(threads), "--out", out]
    done = subprocess.run(command + (["--device", device] if device else []), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(out, "summary.csv"), newline="") as f:
        row = next(csv.DictReader(f))
    if row["status"] != "PASS":
        sys.exit(f"race: {name} did not pass ({row['status']}): {row['message']}\n{done.stdout[-2000:]}")
    return float(row["pp_tokens_per_s"]), int(row["pp_peak_bytes_max"]) if row["pp_peak_bytes_max"] else None


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipecheck", required=True)
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank, for both")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="every row on this device (pipecheck run --device)")
    parser.add_argument("--only", action="append", default=[], help="a pair's pipecheck row name (repeatable)")
    args = parser.parse_args()
    with open(args.scenarios, newline="") as f:
        names = [row["name"] for row in csv.DictReader(line for line in f if not line.lstrip().startswith("#"))]
    pairs = [name for name in names if name + "_torch" in names and (not args.only or name in args.only)]
    if not pairs:
        sys.exit(f"race: {args.scenarios} has no NAME / NAME_torch pair{' among --only' if args.only else ''}")
    results = {name: {"pipecheck": [], "torch": []} for name in pairs}
    with tempfile.TemporaryDirectory(prefix="pipecheck_race_") as scratch:
        for round_index in range(args.rounds):
            for name in pairs:
                order = ("pipecheck", "torch") if round_index % 2 == 0 else ("torch", "pipecheck")
                for contender in order:
                    row = name if contender == "pipecheck" else name + "_torch"
                    out = os.path.join(scratch, f"{row}_{round_index}")
                    results[name][contender].append(run(args.pipecheck, args.scenarios, row, args.threads, out,
                                                                    args.device))
                ours, theirs = results[name]["pipecheck"][-1][0], results[name]["torch"][-1][0]
                print(f"round {round_index + 1}/{args.rounds} {name}: pipecheck {ours:.0f}, torch {theirs:.0f} tokens/s",
                      flush=True)
    print(f"\n{args.rounds} alternating rounds, {args.threads} intra-op thread(s) per rank, {os.cpu_count()} CPUs; "
          "median (min-max) over the rounds; every run passed parity\n")
    print("| scenario | pipecheck tokens/s | torch tokens/s | ratio | pipecheck peak MB | torch peak MB | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in pairs:
        ours = [rate for rate, _ in results[name]["pipecheck"]]
        theirs = [rate for rate, _ in results[name]["torch"]]
        our_peak = [peak / 1e6 for _, peak in results[name]["pipecheck"] if peak is not None]
        their_peak = [peak / 1e6 for _, peak in results[name]["torch"] if peak is not None]
        peaks = (f"{spread(our_peak, lambda v: f'{v:.1f}')} | {spread(their_peak, lambda v: f'{v:.1f}')} | "
                 f"{statistics.median(our_peak) / statistics.median(their_peak):.2f}") if our_peak and their_peak else "- | - | -"
        print(f"| {name} | {spread(ours, lambda v: f'{v:.0f}')} | {spread(theirs, lambda v: f'{v:.0f}')} | "
              f"{statistics.median(ours) / statistics.median(theirs):.2f} | {peaks} |")


if __name__ == "__main__":
    main()
