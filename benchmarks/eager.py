#!/usr/bin/env python3
"""pipecheck's reference trainer against PyTorch eager on the same model, weights and batch.

For each scenario, `pipecheck dump` writes the reference's initial weights and first batch; the
eager contender loads them into the same model written as ordinary PyTorch modules
(trainers/protocol.py's StageModule, one stage holding every layer: docs/design.md's model) and
trains full-batch steps as a PyTorch user would: forward, the loss, backward, torch.optim.AdamW
with the reference's hyper-parameters (PyTorch's default implementation for the device, foreach on
CUDA). Its first loss must equal the reference's first loss within the dtype's tolerance, which
shows both ran the same model. The two alternate over rounds (who goes first swaps every round),
each in a fresh process; each reports the median step time after its warm-up step. Prints, per
scenario, both medians with their ranges and the ratio reference / eager (below 1.0: the
reference is the faster).

--phases adds one more run of each, its step split by phase (data, forward, loss, backward, the
optimizer, ...) with the device synchronised at each phase's end (`pipecheck reference --phases`
for the reference), and prints both side by side: where the two differ.

    benchmarks/eager.py --pipecheck build/pipecheck --scenarios scenarios/gpu.csv --only gpu_throughput_fp32
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOSS_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 3e-2}  # the judges' defaults


def suite_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.lstrip().startswith("#")))


def run_reference(pipecheck, suite, name, threads, phases=False):
    """`pipecheck reference` on one scenario: (median step ms, first step's loss), or with `phases`
    the median ms of each phase ({phase: ms})."""
    done = subprocess.run([pipecheck, "reference", "--scenarios", suite, "--only", name, "--threads", str(threads)]
                          + (["--phases"] if phases else []),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in done.stdout.splitlines():
        fields = line.split()
        if phases and fields and fields[0] == "phases_ms":
            return {key: float(value) for key, value in (field.split("=") for field in fields[1:])}
        if not phases and fields and fields[0] == name and len(fields) >= 4 and fields[1] != "ERROR":
            return float(fields[1]), float(fields[3])
    sys.exit(f"eager: pipecheck reference failed on {name} (exit {done.returncode}):\n{done.stdout[-3000:]}")


def run_eager(folder, threads, phases=False):
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", folder, "--threads", str(threads)]
                          + (["--phases"] if phases else []),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"eager: the eager run of {folder} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["phases_ms"] if phases else (result["step_ms"], result["losses"][0])


class PhaseClock:
    """The step's time by phase, the device synchronised at each phase's end (as the reference's)."""

    def __init__(self, on, device):
        self.on, self.device, self.steps = on, device, []

    def _sync(self):
        if self.device.type == "cuda":
            import torch
            torch.cuda.synchronize(self.device)

    def start(self):
        if self.on:
            self._sync()
            self.steps.append({})
            self.last = time.perf_counter()

    def mark(self, phase):
        if self.on:
            self._sync()
            now = time.perf_counter()
            self.steps[-1][phase] = self.steps[-1].get(phase, 0.0) + (now - self.last) * 1000.0
            self.last = now

    def medians(self):
        timed = self.steps[1:] or self.steps
        return {phase: statistics.median(step.get(phase, 0.0) for step in timed) for phase in timed[0]} if timed else {}


def worker(folder, threads, phases):
    """One eager training run from `pipecheck dump`'s folder; prints one JSON line."""
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "trainers"))
    from protocol import DTYPES, StageModule, token_loss  # docs/design.md §2's model as PyTorch modules

    if threads > 0:
        torch.set_num_threads(threads)
    row = suite_rows(os.path.join(folder, "scenario.csv"))[0]
    device = torch.device("cuda", 0) if row["device"] == "cuda" else torch.device("cpu")
    dtype = DTYPES[row["dtype"]]
    model = {"flavor": row["flavor"], "hidden": int(row["hidden"]), "heads": int(row["heads"]),
             "vocab": int(row["vocab"]), "seq_len": int(row["seq_len"]), "tied": row["tied"] == "1",
             "ffn": int(row["ffn"]), "layers": int(row["layers"])}
    module = StageModule(model, {"embedding": True, "head": True, "layers": [0, model["layers"]]})
    weights = torch.load(os.path.join(folder, "weights.pt"), weights_only=False)  # LibTorch pickles
    module.load_state_dict(weights, strict=True)
    module.to(device=device, dtype=dtype)
    batch = {name: tensor.to(device) for name, tensor in torch.load(os.path.join(folder, "batch.pt"), weights_only=False).items()}
    module.key_lengths = batch["lengths"]
    total_tokens = int((batch["labels"] != -100).sum())
    if row["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(module.parameters(), lr=float(row["lr"]))
    else:  # the reference's AdamW (reference/optimizer.h)
        optimizer = torch.optim.AdamW(module.parameters(), lr=float(row["lr"]), betas=(0.9, 0.999), eps=1e-6,
                                      weight_decay=0.01)
    step_ms, losses = [], []
    clock = PhaseClock(phases, device)
    for _ in range(int(row["steps"])):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        clock.start()
        optimizer.zero_grad(set_to_none=True)
        clock.mark("data")
        logits = module(batch["tokens"])
        clock.mark("forward")
        loss = token_loss(logits, batch["labels"], total_tokens)
        clock.mark("loss")
        loss.backward()
        clock.mark("backward")
        optimizer.step()
        clock.mark("optimizer")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ms.append((time.perf_counter() - started) * 1000.0)
        losses.append(float(loss))
    print(json.dumps({"step_ms": statistics.median(step_ms[1:] or step_ms), "losses": losses,
                      "phases_ms": clock.medians()}))


def spread(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def print_phases(args, names):
    """One more run of each, its step split by phase; both side by side (ms, median of the timed steps)."""
    for name in names:
        reference = run_reference(args.pipecheck, args.scenarios, name, args.threads, phases=True)
        if reference is None:
            sys.exit(f"eager: pipecheck reference --phases printed no phases for {name}")
        eager = run_eager(os.path.join(args.workdir, name), args.threads, phases=True)
        print(f"\n{name}: step split by phase, the device synchronised at each phase's end (ms)\n")
        print("| phase | reference | eager |")
        print("| --- | --- | --- |")
        for phase in list(reference) + [p for p in eager if p not in reference]:
            print(f"| {phase} | {reference.get(phase, 0.0):.2f} | {eager.get(phase, 0.0):.2f} |")
        print(f"| total | {sum(reference.values()):.2f} | {sum(eager.values()):.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipecheck")
    parser.add_argument("--scenarios")
    parser.add_argument("--only", action="append", default=[], help="a scenario's name (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads for both (0: the library's default)")
    parser.add_argument("--workdir", default="build/eager")
    parser.add_argument("--phases", action="store_true",
                        help="one more run of each with its step split by phase, printed side by side")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.threads, args.phases)
    if not args.pipecheck or not args.scenarios:
        parser.error("--pipecheck and --scenarios are required")
    rows = {row["name"]: row for row in suite_rows(args.scenarios)}
    names = args.only or list(rows)
    unknown = [name for name in names if name not in rows]
    if unknown:
        sys.exit(f"eager: {args.scenarios} has no scenario {', '.join(unknown)}")
    results = {}
    for name in names:
        folder = os.path.join(args.workdir, name)
        done = subprocess.run([args.pipecheck, "dump", "--scenarios", args.scenarios, "--scenario", name, "--out", folder],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            sys.exit(f"eager: pipecheck dump {name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
        results[name] = {"reference": [], "eager": [], "loss": {}}
    for round_index in range(args.rounds):
        for name in names:
            order = ("reference", "eager") if round_index % 2 == 0 else ("eager", "reference")
            for contender in order:
                if contender == "reference":
                    ms, loss = run_reference(args.pipecheck, args.scenarios, name, args.threads)
                else:
                    ms, loss = run_eager(os.path.join(args.workdir, name), args.threads)
                results[name][contender].append(ms)
                results[name]["loss"][contender] = loss
            print(f"round {round_index + 1}/{args.rounds} {name}: reference {results[name]['reference'][-1]:.2f} ms, "
                  f"eager {results[name]['eager'][-1]:.2f} ms", flush=True)
    print(f"\n{args.rounds} alternating rounds; median (min-max) step ms after one warm-up step\n")
    print("| scenario | dtype | reference ms | eager ms | reference / eager | first loss: reference, eager |")
    print("| --- | --- | --- | --- | --- | --- |")
    mismatched = []
    for name in names:
        result, dtype = results[name], rows[name].get("dtype") or "float64"
        ref_loss, eager_loss = result["loss"]["reference"], result["loss"]["eager"]
        if not abs(ref_loss - eager_loss) <= LOSS_TOLERANCE[dtype] * max(1.0, abs(ref_loss)):
            mismatched.append(f"{name}: reference {ref_loss:.8f}, eager {eager_loss:.8f}")
        print(f"| {name} | {dtype} | {spread(result['reference'])} | {spread(result['eager'])} | "
              f"{statistics.median(result['reference']) / statistics.median(result['eager']):.3f} | "
              f"{ref_loss:.6f}, {eager_loss:.6f} |")
    if args.phases:
        print_phases(args, names)
    if mismatched:
        sys.exit("eager: the first losses differ, so the two did not run the same model: " + "; ".join(mismatched))


if __name__ == "__main__":
    sys.exit(main())
