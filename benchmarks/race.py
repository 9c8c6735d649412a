#!/usr/bin/env python3
"""pipecheck's trainer against the production pipeline trainers on identical work: each `NAME_torch`
(PyTorch's pipelining), `NAME_torchtitan` (TorchTitan's Trainer), `NAME_deepspeed` (DeepSpeed's
pipeline engine) and `NAME_megatron` (Megatron-Core's schedules) row of the suite against its
twin `NAME`, alternated over rounds (the order of the contenders rotates every round, so that a
noisy machine's drift falls on each in turn), every run judged by pipecheck against the reference
(a run that does not PASS ends the race). Prints, per twin and rival, the median tokens/s and peak
tensor bytes of each with their ranges over the rounds, and the ratios of medians (pipecheck over
the rival); pipecheck's tokens/s over its one-thread reference's (measured in the same run: the
median of the rounds' ratios, each round's, and the ratio of the medians), beside the reference's
own rate over the rounds (the same work each round: how far the host's speed moved); and where
each contender's step went, by kind of work (ranks.csv: pipecheck's timeline, or the trainer's
own "actions_ms"). Every trainer is measured the same way: a step lasts as long as the
slowest rank's, tokens/s is over the median step after the warm-up, peak bytes are the counting
allocator's (CPU) or the CUDA caching allocator's, largest over the ranks.

    benchmarks/race.py --pipecheck build/pipecheck --scenarios benchmarks/peer.csv --rounds 5 --threads 1
"""
import argparse
import collections
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile

# The rivals a row NAME can have, as the suffix of their rows: NAME_torch, NAME_torchtitan, ...
RIVALS = ("torch", "torchtitan", "deepspeed", "megatron")


# One run of one contender: its tokens/s, peak bytes (or None), {kind: ms a step, the mean over the
# ranks} (or None where the trainer gives no account), and its reference's tokens/s (or None).
Run = collections.namedtuple("Run", "rate peak breakdown reference")

# ranks.csv's account of a step, by kind of work (ms), as the breakdown table names them.
KINDS = (("forward_ms", "F"), ("backward_ms", "B"), ("input_grad_ms", "I"), ("weight_grad_ms", "W"),
         ("comm_ms", "comm"), ("idle_ms", "wait"), ("other_ms", "other"))


def run(pipecheck, suite, name, threads, out, device):
    command = [pipecheck, "run", "--scenarios", suite, "--only", name, "--threads", str(threads), "--out", out]
    done = subprocess.run(command + (["--device", device] if device else []), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(out, "summary.csv"), newline="") as f:
        row = next(csv.DictReader(f))
    if row["status"] != "PASS":
        sys.exit(f"race: {name} did not pass ({row['status']}): {row['message']}\n{done.stdout[-2000:]}")
    with open(os.path.join(out, "ranks.csv"), newline="") as f:
        ranks = [rank for rank in csv.DictReader(f) if rank.get("replica", "0") == "0"]
    breakdown = None
    if ranks and all(rank.get(column) for rank in ranks for column, _ in KINDS):
        breakdown = {kind: statistics.mean(float(rank[column]) for rank in ranks) for column, kind in KINDS}
    reference = float(row["ref_tokens_per_s"]) if row.get("ref_tokens_per_s") else None
    return Run(float(row["pp_tokens_per_s"]), int(row["pp_peak_bytes_max"]) if row["pp_peak_bytes_max"] else None,
               breakdown, reference)


def machine(pipecheck):
    """What the figures were measured on: the CPU's model (from /proc/cpuinfo where Linux has one)
    and pipecheck's build (its LibTorch, which the Python rivals share, and its CPU float32 linear).
    The race's outcome depends on both: on an AMD EPYC (Zen 5), MKL's float32 product takes its
    AVX2 path and oneDNN's runs about twice its speed; on an Intel Xeon both run at AVX-512's."""
    cpu = platform.processor() or "an unnamed CPU"
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
        # A virtual machine's model name can be generic ("Intel(R) Xeon(R) Processor"): the family
        # and model numbers tell the generation.
        if "model name" in fields:
            cpu = f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    except OSError:
        pass
    done = subprocess.run([pipecheck, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return f"{cpu} ({os.cpu_count()} CPUs); {done.stdout.strip() or f'{pipecheck} --version said nothing'}"


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
    rivals = {name: [rival for rival in RIVALS if f"{name}_{rival}" in names]
              for name in names if not args.only or name in args.only}
    rivals = {name: present for name, present in rivals.items() if present}
    if not rivals:
        sys.exit(f"race: {args.scenarios} has no NAME / NAME_RIVAL pair (RIVAL: {', '.join(RIVALS)})"
                 f"{' among --only' if args.only else ''}")
    results = {name: {contender: [] for contender in ["pipecheck"] + present} for name, present in rivals.items()}
    with tempfile.TemporaryDirectory(prefix="pipecheck_race_") as scratch:
        for round_index in range(args.rounds):
            for name, present in rivals.items():
                contenders = ["pipecheck"] + present
                shift = round_index % len(contenders)
                for contender in contenders[shift:] + contenders[:shift]:
                    row = name if contender == "pipecheck" else f"{name}_{contender}"
                    out = os.path.join(scratch, f"{row}_{round_index}")
                    results[name][contender].append(run(args.pipecheck, args.scenarios, row, args.threads, out,
                                                        args.device))
                said = ", ".join(f"{contender} {results[name][contender][-1].rate:.0f}" for contender in contenders)
                print(f"round {round_index + 1}/{args.rounds} {name}: {said} tokens/s", flush=True)
    print(f"\n{args.rounds} alternating rounds, {args.threads} intra-op thread(s) per rank; "
          "median (min-max) over the rounds; every run passed parity")
    print(f"machine: {machine(args.pipecheck)}\n")
    print("| scenario | rival | pipecheck tokens/s | rival tokens/s | ratio | pipecheck peak MB | rival peak MB | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, present in rivals.items():
        ours = [run.rate for run in results[name]["pipecheck"]]
        our_peak = [run.peak / 1e6 for run in results[name]["pipecheck"] if run.peak is not None]
        for rival in present:
            theirs = [run.rate for run in results[name][rival]]
            their_peak = [run.peak / 1e6 for run in results[name][rival] if run.peak is not None]
            peaks = (f"{spread(our_peak, lambda v: f'{v:.1f}')} | {spread(their_peak, lambda v: f'{v:.1f}')} | "
                     f"{statistics.median(our_peak) / statistics.median(their_peak):.2f}"
                     ) if our_peak and their_peak else "- | - | -"
            print(f"| {name} | {rival} | {spread(ours, lambda v: f'{v:.0f}')} | {spread(theirs, lambda v: f'{v:.0f}')} | "
                  f"{statistics.median(ours) / statistics.median(theirs):.2f} | {peaks} |")
    # The reference does the same work in every round of a row, so its rate's spread is how far the
    # host's own speed moved over the race: a ratio nearer a target than that is within the noise.
    # Two estimates side by side: the median of each round's own ratio (a round's pipeline and
    # reference ran minutes apart at most), and the ratio of the two medians; where a drifting host
    # sets them apart, neither alone is the figure.
    print("\npipecheck over its one-thread reference, tokens/s (the same run's; median (min-max) over the rounds, "
          "each round's, and the ratio of the two medians), and the reference's own tokens/s: the same work each "
          "round, so its spread is the host's drift\n")
    for name in rivals:
        paired = [run for run in results[name]["pipecheck"] if run.reference]
        references = [run.reference for run in paired]
        ratios = [run.rate / run.reference for run in paired]
        if ratios:
            drift = (max(references) - min(references)) / statistics.median(references)
            of_medians = statistics.median(run.rate for run in paired) / statistics.median(references)
            print(f"- {name}: {spread(ratios, lambda v: f'{v:.2f}')}, rounds "
                  f"{', '.join(f'{v:.2f}' for v in ratios)}, the ratio of the medians {of_medians:.2f}; "
                  f"the reference {spread(references, lambda v: f'{v:.0f}')} tokens/s, a spread of {drift:.1%}")
    # Where each contender's step went: ranks.csv's kinds of work, ms a step (the mean over the
    # ranks), the median over the rounds; a trainer that reports no account of its own shows '-'.
    print("\nms a step by kind of work (mean over the ranks, median over the rounds): F forwards with their loss, "
          "B full backwards, I and W a split backward's halves, comm sending and receiving, wait for an input, "
          "other the rest of the step (optimizer, clipping, gradient sums, the schedule's own work)\n")
    print("| scenario | trainer | " + " | ".join(kind for _, kind in KINDS) + " | step |")
    print("| --- | --- | " + " | ".join("---" for _ in KINDS) + " | --- |")
    for name, present in rivals.items():
        for contender in ["pipecheck"] + present:
            accounts = [run.breakdown for run in results[name][contender] if run.breakdown]
            if not accounts:
                print(f"| {name} | {contender} | " + " | ".join("-" for _ in KINDS) + " | - |")
                continue
            cells = [statistics.median(account[kind] for account in accounts) for _, kind in KINDS]
            step = statistics.median(sum(account.values()) for account in accounts)
            print(f"| {name} | {contender} | " + " | ".join(f"{cell:.1f}" for cell in cells) + f" | {step:.1f} |")

if __name__ == "__main__":
    main()
