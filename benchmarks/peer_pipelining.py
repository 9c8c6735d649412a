#!/usr/bin/env python3
"""pipecheck checks PyTorch's own pipelining, and races it.

For one scenario of a suite, this builds the model of docs/design.md §2 with PyTorch modules, splits
it into the same stages as pipecheck (uniform partition: the first layers % stages stages get one
more layer; embedding on the first stage, final norm, head and loss on the last), starts the same
number of ranks (Gloo on CPU, one process each) and trains with torch.distributed.pipelining's
ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B (virtual_stages stages per rank, stage s
on rank s % ranks, as pipecheck places them) over the scenario's microbatches:

1. Parity: the weights and batch of step 0 come from `pipecheck dump` (weights.pt, batch.pt); the
   loss is the summed token cross entropy over the whole batch's tokens (no extra scaling, so
   `scale_grads=False` where the schedule has it); the first step's loss and every parameter's
   gradient must match pipecheck's reference (loss.pt, grads.pt) to the dtype's tolerance.
2. Speed: `--steps` steps with AdamW (the reference's hyper-parameters), the median step after one
   warm-up step, in tokens/s; and pipecheck's own `pp_tokens_per_s` for the same scenario
   (`pipecheck run --only NAME`), the two alternated over `--rounds` rounds as
   shared/MEASURING.md asks; medians, spreads and the ratio are printed side by side.

Limits (each refused with a message, exit 2): GPipe, 1F1B and interleaved 1F1B only, uniform
partition, batch divisible by microbatches (pipelining's microbatches share one shape), device
cpu. Sequences keep their own lengths: every microbatch is padded to the batch's longest
sequence, padded keys are masked and padded labels ignored, so the arithmetic matches up to
rounding.

Needs PyTorch >= 2.4 (torch.distributed.pipelining); requirements.txt pins the version pipecheck
builds against, and where pipelining is missing the script fails (exit 1).
"""
import argparse
import csv
import inspect
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

try:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
except ImportError as error:
    sys.exit(f"FAIL: torch.distributed.pipelining needs PyTorch >= 2.4; this is {torch.__version__} ({error})")

TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 3e-2}
# As pipecheck's judge (harness/parity.h): a gradient's error is relative to max(its norm, this
# fraction of the whole model's gradient norm), so analytically-zero gradients (a key bias) are
# held to an absolute bound instead of a meaningless relative one.
GRADIENT_FLOOR = {"float64": 1e-5, "float32": 1e-3, "bfloat16": 3e-3}
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
ADAMW = dict(betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)  # reference/optimizer.h


def ffn_size(hidden, flavor, ffn):
    if ffn > 0:
        return ffn
    if flavor == "gpt2":
        return 4 * hidden
    return ((8 * hidden + 2) // 3 + 3) // 4 * 4


class Norm(nn.Module):
    def __init__(self, flavor, hidden):
        super().__init__()
        self.flavor = flavor
        self.weight = nn.Parameter(torch.ones(hidden))
        if flavor == "gpt2":
            self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        stats = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        if self.flavor == "llama":
            normed = stats * torch.rsqrt(stats.pow(2).mean(-1, keepdim=True) + 1e-5)
            return self.weight * normed.to(x.dtype)
        centred = stats - stats.mean(-1, keepdim=True)
        normed = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * normed.to(x.dtype) + self.bias


class Attention(nn.Module):
    def __init__(self, flavor, hidden, heads):
        super().__init__()
        bias = flavor == "gpt2"
        self.flavor, self.heads = flavor, heads
        for name in ("wq", "wk", "wv", "wo"):
            setattr(self, name, nn.Linear(hidden, hidden, bias=bias))

    def forward(self, x, keep):
        b, t, c = x.shape
        hd = c // self.heads
        q, k, v = (w(x).view(b, t, self.heads, hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.flavor == "llama":
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd))
            angles = torch.outer(torch.arange(t, dtype=torch.float64, device=x.device), inv_freq)
            table = torch.cat([angles, angles], -1)
            cos, sin = table.cos().to(x.dtype), table.sin().to(x.dtype)
            half = hd // 2

            def rotate(u):
                return u * cos + torch.cat([-u[..., half:], u[..., :half]], -1) * sin

            q, k = rotate(q), rotate(k)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        scores = scores.masked_fill(~keep, float("-inf"))
        mixed = torch.softmax(scores, -1) @ v
        return self.wo(mixed.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, flavor, hidden, ffn):
        super().__init__()
        bias = flavor == "gpt2"
        self.flavor = flavor
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        if flavor == "llama":
            self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x):
        if self.flavor == "llama":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, flavor, hidden, heads, ffn):
        super().__init__()
        self.attention_norm = Norm(flavor, hidden)
        self.attention = Attention(flavor, hidden, heads)
        self.ffn_norm = Norm(flavor, hidden)
        self.feed_forward = FeedForward(flavor, hidden, ffn)

    def forward(self, x, keep):
        h = x + self.attention(self.attention_norm(x), keep)
        return h + self.feed_forward(self.ffn_norm(h))


class StageModule(nn.Module):
    """Layers [first, end) of the model, the embedding on stage 0, the head on the last stage,
    under docs/design.md §2's parameter names. Pipelining passes only hidden states between stages, so
    each stage is told the step's per-microbatch lengths and counts its forwards (GPipe and 1F1B
    run a stage's forwards in microbatch order)."""

    def __init__(self, row, first, end, has_embedding, has_head):
        super().__init__()
        flavor, hidden, heads = row["flavor"], int(row["hidden"]), int(row["heads"])
        self.flavor, self.has_embedding, self.has_head = flavor, has_embedding, has_head
        vocab, ffn = int(row["vocab"]), ffn_size(hidden, flavor, int(row["ffn"] or 0))
        tied = row["tied"] == "1"
        if has_embedding or (has_head and tied):
            self.tok_embeddings = nn.Embedding(vocab, hidden)
        if has_embedding and flavor == "gpt2":
            self.pos_embeddings = nn.Embedding(int(row["seq_len"]), hidden)
        self.layers = nn.ModuleDict({str(i): Block(flavor, hidden, heads, ffn) for i in range(first, end)})
        if has_head:
            self.norm = Norm(flavor, hidden)
            if not tied:
                self.output = nn.Linear(hidden, vocab, bias=False)
        self.microbatch_lengths = []
        self.calls = 0

    def begin_step(self, microbatch_lengths):
        self.microbatch_lengths, self.calls = microbatch_lengths, 0

    def forward(self, x):
        if x.device.type == "meta":  # pipelining's shape inference: no microbatch consumed
            t = x.shape[1]
            keep = torch.ones(x.shape[0], 1, t, t, dtype=torch.bool, device=x.device)
        else:
            lengths = self.microbatch_lengths[self.calls % len(self.microbatch_lengths)]
            self.calls += 1
            t = x.shape[1]
            positions = torch.arange(t, device=x.device)
            keep = ((positions[:, None] >= positions[None, :])[None] & (positions[None, None, :] < lengths[:, None, None].to(x.device)))[:, None]
        if self.has_embedding:
            x = self.tok_embeddings(x)
            if self.flavor == "gpt2":
                x = x + self.pos_embeddings(torch.arange(x.shape[1], device=x.device))
        for block in self.layers.values():
            x = block(x, keep)
        if self.has_head:
            head = self.output.weight if hasattr(self, "output") else self.tok_embeddings.weight
            x = F.linear(self.norm(x), head)
        return x


def uniform_counts(layers, stages):
    return [layers // stages + (1 if i < layers % stages else 0) for i in range(stages)]


def read_row(suite, name):
    with open(suite, newline="") as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.lstrip().startswith("#")) if r["name"] == name]
    if not rows:
        sys.exit(f"peer_pipelining: {suite}: no scenario called {name!r}")
    return rows[0]


def effective_row(dump_directory):
    with open(os.path.join(dump_directory, "scenario.csv"), newline="") as f:
        return next(csv.DictReader(f))


def check_supported(row):
    problems = []
    if row["schedule"] not in ("gpipe", "1f1b", "interleaved"):
        problems.append(f"schedule {row['schedule']} (gpipe, 1f1b and interleaved only)")
    if row["partition"] != "uniform":
        problems.append(f"partition {row['partition']} (uniform only)")
    if int(row["batch"]) % int(row["microbatches"]) != 0:
        problems.append("a batch not divisible by its microbatches (pipelining's microbatches share one shape)")
    if row["device"] != "cpu":
        problems.append(f"device {row['device']} (cpu only)")
    if problems:
        print("peer_pipelining: this scenario uses " + "; ".join(problems), file=sys.stderr)
        sys.exit(2)


SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


def make_schedule(name, stages, microbatches, loss_fn):
    cls = SCHEDULE_CLASSES[name]
    kwargs = {}
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False  # the loss is already normalised by the whole batch's tokens
    return cls(stages if name == "interleaved" else stages[0], microbatches, loss_fn=loss_fn, **kwargs)


def rank_main(rank, world, port, dump_directory, steps, threads, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    row = effective_row(dump_directory)
    dtype = DTYPES[row["dtype"]]
    stage_count = world * int(row["virtual_stages"])
    counts = uniform_counts(int(row["layers"]), stage_count)
    own_stages = list(range(rank, stage_count, world))  # stage s on rank s % world
    weights = torch.load(os.path.join(dump_directory, "weights.pt"), weights_only=False)
    batch = torch.load(os.path.join(dump_directory, "batch.pt"), weights_only=False)
    tokens, labels, lengths = batch["tokens"], batch["labels"], batch["lengths"]
    microbatches = int(row["microbatches"])
    total = int((labels != -100).sum())
    b, t, hidden = tokens.shape[0] // microbatches, tokens.shape[1], int(row["hidden"])
    stage_parameters = inspect.signature(PipelineStage.__init__).parameters
    modules, stages = [], []
    for index in own_stages:
        first = sum(counts[:index])
        module = StageModule(row, first, first + counts[index], index == 0, index == stage_count - 1).to(dtype)
        own = module.state_dict()
        missing = [name for name in own if name not in weights]
        if missing:
            raise RuntimeError(f"weights.pt lacks {missing}")
        module.load_state_dict({name: weights[name] for name in own})
        example = tokens[:b] if index == 0 else torch.zeros(b, t, hidden, dtype=dtype)
        output_example = torch.zeros(b, t, int(row["vocab"]) if index == stage_count - 1 else hidden, dtype=dtype)
        stage_kwargs = {}
        if "input_args" in stage_parameters:
            stage_kwargs["input_args"] = (example,)
        if "output_args" in stage_parameters:
            stage_kwargs["output_args"] = (output_example,)
        modules.append(module)
        stages.append(PipelineStage(module, index, stage_count, torch.device("cpu"), **stage_kwargs))

    def loss_fn(logits, target):
        as_loss = logits if logits.dtype == torch.float64 else logits.float()
        return F.cross_entropy(as_loss.reshape(-1, as_loss.shape[-1]), target.reshape(-1), ignore_index=-100,
                               reduction="sum") / total

    schedule = make_schedule(row["schedule"], stages, microbatches, loss_fn)
    tied = row["tied"] == "1" and world > 1
    tied_group = dist.new_group([0, world - 1]) if tied else None
    optimizer = torch.optim.AdamW([p for module in modules for p in module.parameters()], lr=float(row["lr"]), **ADAMW)
    chunks = list(torch.tensor_split(lengths, microbatches))
    step_seconds, first_loss, first_grads = [], None, None
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for module in modules:
            module.begin_step(chunks)
        dist.barrier()
        start = time.perf_counter()
        losses = []
        if rank == 0:
            schedule.step(tokens)
        elif rank == world - 1:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step()
        if tied and rank in (0, world - 1):
            tied_module = modules[0] if rank == 0 else modules[-1]
            dist.all_reduce(tied_module.tok_embeddings.weight.grad, group=tied_group)
        if step == 0:
            first_grads = {n: p.grad.detach().clone() for module in modules for n, p in module.named_parameters()
                           if p.grad is not None}
            first_loss = float(sum(l.detach().double() for l in losses)) if losses else None
        optimizer.step()
        dist.barrier()
        step_seconds.append(time.perf_counter() - start)
    results[rank] = {"loss": first_loss, "grads": first_grads, "step_seconds": step_seconds}
    dist.destroy_process_group()


def run_peer(dump_directory, world, steps, threads):
    port = 29600 + os.getpid() % 1000
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(rank_main, args=(world, port, dump_directory, steps, threads, results), nprocs=world, join=True)
    return dict(results)


def check_parity(dump_directory, row, results):
    tol = float(row["tol"]) if row.get("tol") else TOLERANCE[row["dtype"]]
    reference_loss = float(torch.load(os.path.join(dump_directory, "loss.pt"), weights_only=False)["loss"])
    reference_grads = torch.load(os.path.join(dump_directory, "grads.pt"), weights_only=False)
    problems = []
    loss = results[len(results) - 1]["loss"]
    if loss is None or abs(loss - reference_loss) > tol * max(1.0, abs(reference_loss)):
        problems.append(f"loss {loss} vs reference {reference_loss}")
    worst, worst_name, checked = 0.0, "", 0
    global_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in reference_grads.values()))
    floor = GRADIENT_FLOOR[row["dtype"]] * global_norm
    for rank, result in results.items():
        for name, grad in result["grads"].items():
            expected = reference_grads[name].double()
            error = float((grad.double() - expected).norm()) / max(float(expected.norm()), floor, 1e-300)
            checked += 1
            if error > worst:
                worst, worst_name = error, f"{name} (rank {rank})"
    if checked != len(reference_grads) + (1 if row["tied"] == "1" and len(results) > 1 else 0):
        problems.append(f"{checked} gradients checked, the reference has {len(reference_grads)}")
    if worst > tol:
        problems.append(f"gradient of {worst_name}: rel err {worst:.3g} > tol {tol:g}")
    return problems, reference_loss, loss, worst


def tokens_per_second(step_seconds, tokens):
    timed = step_seconds[1:] if len(step_seconds) > 1 else step_seconds
    return tokens / statistics.median(timed)


def pipecheck_tokens_per_second(pipecheck, suite, name, threads, out):
    subprocess.run([pipecheck, "run", "--scenarios", suite, "--only", name, "--threads", str(threads), "--out", out],
                   check=False, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.csv"), newline="") as f:
        row = next(csv.DictReader(f))
    return float(row["pp_tokens_per_s"]) if row["pp_tokens_per_s"] else float("nan"), row["status"]


class Contest:
    """One scenario: its dump, its effective row, the steps each run takes, and the tokens/s each
    contender measured."""

    def __init__(self, pipecheck, suite, name, scratch, steps):
        self.name = name
        self.dump = os.path.join(scratch, name, "dump")
        done = subprocess.run([pipecheck, "dump", "--scenarios", suite, "--scenario", name, "--out", self.dump])
        if done.returncode != 0:
            sys.exit(f"peer_pipelining: pipecheck dump of {name} failed ({done.returncode})")
        self.row = effective_row(self.dump)
        check_supported(self.row)
        self.world = int(self.row["world_size"])
        self.steps = steps or max(3, int(self.row["steps"]))
        batch = torch.load(os.path.join(self.dump, "batch.pt"), weights_only=False)
        self.tokens = int((batch["labels"] != -100).sum())  # the reference's tokens of a step, as pipecheck counts
        self.ours, self.theirs = [], []

    def label(self):
        virtual = int(self.row["virtual_stages"])
        return f"{self.row['schedule']}, {self.world} ranks" + (f" x {virtual} stages" if virtual > 1 else "") + \
               f", m={self.row['microbatches']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipecheck", required=True, help="the pipecheck binary")
    parser.add_argument("--scenarios", required=True, help="suite CSV")
    parser.add_argument("--scenario", required=True, action="append",
                        help="scenario name (repeat it to race several in one run)")
    parser.add_argument("--steps", type=int, default=0, help="steps per round (default: the scenario's, at least 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating pipecheck and PyTorch")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank, for both")
    parser.add_argument("--parity-only", action="store_true", help="check parity, skip the race")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="peer_pipelining_") as scratch:
        contests = [Contest(args.pipecheck, args.scenarios, name, scratch, args.steps) for name in args.scenario]
        for contest in contests:
            results = run_peer(contest.dump, contest.world, 1 if args.parity_only else contest.steps, args.threads)
            problems, reference_loss, loss, worst = check_parity(contest.dump, contest.row, results)
            print(f"parity of torch {torch.__version__} pipelining ({contest.label()}, {contest.row['dtype']}): "
                  f"loss {loss} vs reference {reference_loss}, worst gradient rel err {worst:.3g}", flush=True)
            if problems:
                print(f"FAIL {contest.name}: " + "; ".join(problems))
                sys.exit(1)
        if args.parity_only:
            print("PASS")
            return

        # Rounds alternate the contenders and swap who goes first each round, so neither always
        # runs on a machine the other has just warmed or loaded.
        for round_index in range(args.rounds):
            for contest in contests:
                order = ("pipecheck", "torch") if round_index % 2 == 0 else ("torch", "pipecheck")
                for contender in order:
                    if contender == "pipecheck":
                        rate, status = pipecheck_tokens_per_second(
                            args.pipecheck, args.scenarios, contest.name, args.threads,
                            os.path.join(scratch, contest.name, f"run{round_index}"))
                        if status != "PASS":
                            sys.exit(f"peer_pipelining: pipecheck's own run of {contest.name} did not pass ({status})")
                        contest.ours.append(rate)
                    else:
                        step_seconds = run_peer(contest.dump, contest.world, contest.steps, args.threads)[0]["step_seconds"]
                        contest.theirs.append(tokens_per_second(step_seconds, contest.tokens))
                print(f"round {round_index + 1}/{args.rounds} {contest.name}: pipecheck {contest.ours[-1]:.0f}, "
                      f"torch.distributed.pipelining {contest.theirs[-1]:.0f} tokens/s", flush=True)

        print(f"\n{args.rounds} alternating rounds, {args.threads} intra-op thread(s) per rank, torch {torch.__version__}, "
              f"{os.cpu_count()} CPUs; tokens/s: median (min-max)\n")
        print("| scenario | schedule | pipecheck | torch.distributed.pipelining | ratio |")
        print("| --- | --- | --- | --- | --- |")
        for contest in contests:
            ours, theirs = statistics.median(contest.ours), statistics.median(contest.theirs)
            print(f"| {contest.name} | {contest.label()} | {ours:.0f} ({min(contest.ours):.0f}-{max(contest.ours):.0f}) | "
                  f"{theirs:.0f} ({min(contest.theirs):.0f}-{max(contest.theirs):.0f}) | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
