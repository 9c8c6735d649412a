#!/usr/bin/env python3
"""PyTorch's own pipelining as a trainer under test (`trainer=torch`), speaking pipecheck's
external-trainer protocol (protocol.py, docs/protocol.md) like any other trainer.

Each rank builds its stages of docs/design.md §2's model (config.json's partition and placement),
loads pipecheck's initial weights, wraps each stage in torch.distributed.pipelining's PipelineStage
and trains config.json's steps with the scenario's schedule class:

  gpipe ScheduleGPipe, 1f1b Schedule1F1B, interleaved ScheduleInterleaved1F1B, loopedbfs
  ScheduleLoopedBFS, zbh1 ScheduleInterleavedZeroBubble, zbv ScheduleZBVZeroBubble, dualpipev
  ScheduleDualPipeV, csv:PATH PyTorch's _PipelineScheduleRuntime loading the CSV: compute-only
  (PyTorch adds the communication) or compute_comms (run as written).

It does what a user of pipelining must do around the schedule, the way PyTorch's documentation and
TorchTitan do it: the loss is the batch's summed token cross entropy over its labelled tokens (so
`scale_grads=False`); a tied embedding held by two ranks has its gradient summed between them
(one all-reduce), and held twice by one rank (a V) is one shared Parameter; gradients are clipped
by the global norm (the tied weight counted once); then the reference's optimizer steps. Whatever
PyTorch computes is handed back unaltered for pipecheck to judge.

A mixture of experts (config.json's model.moe) is trained as a pipelining user must: pipelining
backpropagates from each stage's output only (the last stage's from its loss), so each MoE layer's
balance-loss term rides on the layer's residual add, an autograd function that gives the term
gradient 1 in the backward (protocol.py's ResidualWithBalanceLoss; Megatron-Core's
MoEAuxLossAutoScaler pattern, except that it returns a new tensor, not its input: fault
identity_attach takes that form, whose view output PyTorch's split backward cannot detach). The
step's reported loss is the cross entropy plus every rank's terms (one all-reduce of their sum),
and "aux_loss" hands that sum back on its own. With expert_bias, the biases move as TorchTitan moves
them (ExpertBiasBalancer: counts in a buffer, an optimizer step pre-hook), and each step hands back
the biases and the counts that moved them.

A run that stops and resumes at another layout (config.json's "resume") saves its state with
torch.distributed.checkpoint after its last step and loads it at the next layout before its first,
every entry under its global name (checkpoint_state).

Needs PyTorch >= 2.4 (torch.distributed.pipelining); exit 2 when it is missing.
"""
import csv
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from protocol import (ActionClock, BoundaryTaps, Exchange, Meter, Microbatches, StageModule,  # noqa: E402
                      clip_factor, make_optimizer, token_loss)

try:
    from torch.distributed import pipelining
    from torch.distributed.pipelining import PipelineStage
except ImportError as error:
    print(f"torch_pipelining: torch.distributed.pipelining needs PyTorch >= 2.4; this is {torch.__version__} ({error})",
          file=sys.stderr)
    sys.exit(2)

SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                    "loopedbfs": "ScheduleLoopedBFS", "zbh1": "ScheduleInterleavedZeroBubble",
                    "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
SINGLE_STAGE = ("gpipe", "1f1b")
# PyTorch's pipelining runs as it ships; the only "fault" it takes undoes this file's one workaround.
FAULTS = {"none": "PyTorch's pipelining as it ships, with Gloo's self-sends stepped around (step_around_self_sends)",
          "stock_p2p_init": "also PyTorch's own first-step self-sends, which Gloo cannot carry",
          "corrupt_activation": "a control: stage 1's input of microbatch 1 arrives scaled by 1.01 at every step, as a "
                                "transport that corrupts one message would deliver it",
          "identity_attach": "each MoE layer's balance-loss term attached by a function that hands its input on as it is "
                             "(Megatron-Core's MoEAuxLossAutoScaler form), not on the residual add: a stage ending in "
                             "an MoE layer then outputs a view",
          "balance_last_stage_only": "a control: only the stage holding the head lets its balance-loss terms into the "
                                     "backward (the others' are logged, not trained), as a loss function on the last "
                                     "stage alone would have it",
          "bias_counts_kept": "a control: the expert-bias hook moves the biases but never zeroes the counts, so each "
                              "step's counts hold every earlier step's too",
          "bias_counts_recomputed": "under recompute=1, the counts used as the forwards left them, without "
                                    "TorchTitan's halving for the recomputed forwards",
          "resume_step_reset": "a control: at a resume, AdamW's step counts set back to 0 after "
                               "torch.distributed.checkpoint has loaded them"}


def corrupt_arrivals(microbatches):
    """fault=corrupt_activation: stage 1's input of microbatch 1 is scaled by 1.01 before the stage
    (and the boundary taps) see it, every step."""
    microbatches.transforms.append(lambda stage, microbatch, x: x * 1.01 if (stage, microbatch) == (1, 1) else None)


def step_around_self_sends():
    """Since pytorch/pytorch#160210 a schedule's first step sends a dummy tensor to each stage's
    neighbours (_get_init_p2p_neighbors_ops) even when the neighbour stage is on the same rank, as
    in every V schedule; NCCL accepts a send to oneself, Gloo has no such pair and
    fails ("Pair is not connected"). On Gloo those self-sends are left out here, so that the V
    schedules' arithmetic can be judged on the CPU; fault=stock_p2p_init keeps them (as shipped)."""
    from torch.distributed.pipelining import stage as stage_module
    base = stage_module._PipelineStageBase
    original = getattr(base, "_get_init_p2p_neighbors_ops", None)
    if original is None:
        return
    base._get_init_p2p_neighbors_ops = lambda self: [op for op in original(self) if op.group_peer != self.group_rank]


def schedule_class(name):
    cls = getattr(pipelining.schedules, SCHEDULE_CLASSES[name], None)
    if cls is None:
        print(f"torch_pipelining: PyTorch {torch.__version__} has no {SCHEDULE_CLASSES[name]}", file=sys.stderr)
        sys.exit(2)
    return cls


def csv_format(path):
    """PyTorch's CSV format of a schedule file: compute_comms when it holds communication (SEND_F,
    RECV_F, SEND_B, RECV_B: run as written), else compute_only (PyTorch lowers it itself)."""
    with open(path, newline="") as f:
        text = f.read()
    return "compute_comms" if any(kind in text for kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B")) else "compute_only"


def without_send_waits(path, folder):
    """Releases before 2.15 have no WAIT_SEND_F / WAIT_SEND_B (their runtime waits for a step's
    sends itself, at its end) and refuse a compute_comms file that names them: for those, the
    file less its wait cells, copied into this rank's `folder`. The one place this trainer changes
    a schedule."""
    with open(path, newline="") as f:
        rows = [[cell for cell in row if "WAIT_SEND_" not in cell] for row in csv.reader(f)]
    copy = os.path.join(folder, "schedule_without_send_waits.csv")
    with open(copy, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return copy


def make_schedule(config, stages, loss_fn, folder):
    name, microbatches = config["schedule"], config["microbatches"]
    if name.startswith("csv:"):
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
        schedule = _PipelineScheduleRuntime(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
        path, kind = config["schedule_csv"], csv_format(config["schedule_csv"])
        if kind == "compute_comms" and not hasattr(pipelining.schedules._ComputationType, "WAIT_SEND_F"):
            path = without_send_waits(path, folder)
        schedule._load_csv(path, format=kind)
        return schedule
    cls = schedule_class(name)
    kwargs = {}
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False  # the loss is already normalised by the whole batch's tokens
    return cls(stages[0] if name in SINGLE_STAGE else stages, microbatches, loss_fn=loss_fn, **kwargs)


def build_stages(exchange, device, weights):
    """This rank's stage modules (a tied embedding shared when both its stages are here), loaded
    with pipecheck's initial weights, and their PipelineStages."""
    config, model = exchange.config, exchange.config["model"]
    modules = []
    for stage in exchange.stages_of_rank():
        module = StageModule(model, stage).to(exchange.dtype)
        keep_balancing_state(module, exchange.dtype)
        if model["tied"] and stage["head"] and modules and modules[0].has_embedding:
            module.tok_embeddings = modules[0].tok_embeddings  # one Parameter, as a single model would have it
        state = module.state_dict()  # pipecheck's weights; the expert biases start at their zeros
        module.load_state_dict({name: weights[name] if name in weights else state[name] for name in state})
        modules.append(module.to(device))
    stages = [PipelineStage(module, stage["stage"], len(config["stages"]), device)
              for module, stage in zip(modules, exchange.stages_of_rank())]
    return modules, stages


def keep_balancing_state(module, dtype):
    """Auxiliary-loss-free balancing's state out of the model's dtype, as TorchTitan keeps it out of
    FSDP's: the expert biases in the router's (float64 for float64 models, else float32), the
    counts in float32 (whole numbers, exact to 2^24 where bfloat16 rounds past 256)."""
    router = torch.float64 if dtype == torch.float64 else torch.float32
    for layer in module.modules():
        if hasattr(layer, "expert_bias"):
            layer.expert_bias = layer.expert_bias.to(router)
            layer.tokens_per_expert = layer.tokens_per_expert.float()


class ExpertBiasBalancer:
    """DeepSeek-V3's auxiliary-loss-free balancing as TorchTitan runs it: each MoE layer counts its
    tokens per expert in every forward (a buffer), and an optimizer step pre-hook moves each of
    this rank's layers' biases by gamma * sign(mean count - count) and zeroes the counts (with data
    parallelism it would sum them over the replicas first; this trainer runs one). `moved` keeps
    the counts of the last update, under pipecheck's names, for the step's record."""

    def __init__(self, modules, gamma, zero_counts=True, recomputed=False):
        # recomputed: under full activation checkpointing every forward runs twice, and the counts
        # are halved before use, as TorchTitan's hook does (`// 2`, pytorch/torchtitan#1593).
        self.gamma, self.moved, self.zero_counts, self.recomputed = gamma, {}, zero_counts, recomputed
        self.layers = {name: layer for module in modules for name, layer in module.named_modules()
                       if hasattr(layer, "expert_bias")}

    def __call__(self, *_):
        self.moved = {}
        with torch.no_grad():
            for name, layer in self.layers.items():
                counts = layer.tokens_per_expert // 2 if self.recomputed else layer.tokens_per_expert
                counts = counts.to(layer.expert_bias.dtype)
                layer.expert_bias.add_(self.gamma * torch.sign(counts.mean() - counts))
                self.moved[name + ".expert_counts"] = counts.clone()
                if self.zero_counts:
                    layer.tokens_per_expert.zero_()

    def biases(self):
        return {name + ".expert_bias": layer.expert_bias for name, layer in self.layers.items()}


def checkpoint_state(named, optimizer, balancer, next_step):
    """This rank's training state as torch.distributed.checkpoint saves and loads it, every entry
    under its global name so that any other layout loads it: the parameters and expert biases
    ("model"), AdamW's state of each parameter flattened by name as get_optimizer_state_dict's
    flatten_optimizer_state_dict gives it ("optim": "state.NAME.exp_avg", ...; an optimizer state
    dict keyed by position would map moments to whichever parameter a new partition puts there),
    and the data position ("data.next_step"). A tied weight held by two ranks is one entry, which
    DCP writes once. For a load, the optimizer's entries are made (zeros) where it has taken no
    step yet: DCP loads into the tensors it is given."""
    model = dict(named)
    if balancer is not None:
        model.update(balancer.biases())
    optim = {}
    for name, p in named.items():
        if optimizer is None or isinstance(optimizer, torch.optim.SGD):
            break
        state = optimizer.state[p]
        if not state:  # before any step: what a load fills in
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            optim[f"state.{name}.{key}"] = state[key]
    return {"model": model, "optim": optim, "data": {"next_step": torch.tensor(next_step, dtype=torch.int64)}}


def load_checkpoint(folder, state, first_step, fault):
    """The state this rank holds, loaded in place from the previous layout's checkpoint."""
    import torch.distributed.checkpoint as dcp
    with torch.no_grad():  # into the parameters themselves
        dcp.load(state, checkpoint_id=folder)
    loaded = int(state["data"]["next_step"])
    if loaded != first_step:
        print(f"torch_pipelining: the checkpoint in {folder} resumes at step {loaded}, not {first_step}", file=sys.stderr)
        sys.exit(1)
    if fault == "resume_step_reset":
        for key, value in state["optim"].items():
            if key.endswith(".step"):
                value.zero_()


def named_parameters(modules):
    """This rank's parameters by global name, each once."""
    named = {}
    for module in modules:
        for name, parameter in module.named_parameters():
            named.setdefault(name, parameter)
    return named


def main():
    exchange = Exchange()
    config = exchange.config
    if exchange.refuses_fault(FAULTS, "torch_pipelining"):
        return 2
    device = exchange.device()
    if device.type == "cpu" and exchange.fault != "stock_p2p_init":
        step_around_self_sends()
    meter = Meter(device)
    clock = ActionClock()  # uninstalled (off the CPU, or a release without the functions): it times nothing
    if device.type == "cpu":
        clock.install_pipelining()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    stage_ranks = [stage["rank"] for stage in config["stages"]]
    first_rank, last_rank = stage_ranks[0], stage_ranks[-1]
    tied_across = config["model"]["tied"] and first_rank != last_rank
    tied_group = dist.new_group(sorted({first_rank, last_rank})) if tied_across else None

    moe = config["model"].get("moe")
    balanced = bool(moe) and moe["aux_loss"] > 0  # a mixture of experts with a balance loss
    weights = exchange.weights()
    modules, stages = build_stages(exchange, device, weights)
    recompute = config["scenario"].get("recompute") == "1"
    for module in modules:
        module.recompute = recompute
    if exchange.fault == "balance_last_stage_only":
        for module in modules:
            if not module.has_head:
                for block in module.layers.values():
                    block.attach_balance = None
    if exchange.fault == "identity_attach":
        for module in modules:
            for block in module.layers.values():
                block.attach_balance = "identity"
    microbatches = Microbatches(modules, exchange.stages_of_rank(), config["microbatch_sizes"], stages)
    if exchange.fault == "corrupt_activation":  # the taps see what arrived
        corrupt_arrivals(microbatches)
    taps = BoundaryTaps(microbatches)
    named = named_parameters(modules)
    holds_first = exchange.rank == first_rank
    holds_last = exchange.rank == last_rank
    # The tied weight is counted once in the global norm: by the first stage's rank.
    counted = [p for name, p in named.items() if not (tied_across and holds_last and not holds_first
                                                       and name == "tok_embeddings.weight")]
    # A rank whose stages hold no layers (empty stages) has nothing to update.
    optimizer = make_optimizer(config, list(named.values())) if named else None
    gamma = moe.get("expert_bias", 0) if moe else 0
    balancer = None
    if gamma > 0:
        balancer = ExpertBiasBalancer(modules, gamma, zero_counts=exchange.fault != "bias_counts_kept",
                                      recomputed=recompute and exchange.fault != "bias_counts_recomputed")
    if balancer is not None and balancer.layers:
        optimizer.register_step_pre_hook(balancer)  # as TorchTitan's MoE training registers it
    # A stretch of a resumed run (config.json's "resume"): its steps from first_step on, from the
    # previous layout's checkpoint; the weights it loaded are what it hands back as start.pt.
    resume = config.get("resume") or {}
    first_step = int(resume.get("first_step", 0))
    if resume.get("load"):
        load_checkpoint(resume["load"], checkpoint_state(named, optimizer, balancer, first_step), first_step,
                        exchange.fault)
    exchange.save_start({name: p for name, p in named.items()})
    # Each step's loss is divided by that step's labelled tokens (design §2).
    labelled = {"tokens": 1}
    schedule = make_schedule(config, stages, lambda logits, target: token_loss(logits, target, labelled["tokens"]),
                             exchange.folder)

    for step in range(first_step, config["steps"]):
        batch = exchange.batch(step)
        # Pipelining's stages keep the shapes of their first step (a later shape is a
        # PipeliningShapeError), so every batch is padded to seq_len, as fixed-length training does;
        # the padding's labels are ignored and its keys masked.
        pad = config["model"]["seq_len"] - batch["tokens"].shape[1]
        tokens = torch.nn.functional.pad(batch["tokens"], (0, pad)).to(device)
        labels = torch.nn.functional.pad(batch["labels"], (0, pad), value=-100).to(device)
        labelled["tokens"] = int((batch["labels"] != -100).sum())
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        microbatches.begin_step(batch["lengths"])
        taps.begin_step()
        dist.barrier()
        meter.start_step()
        clock.take()
        losses = []
        args = (tokens,) if holds_first else ()
        kwargs = dict(target=labels, losses=losses) if holds_last else {}
        schedule.step(*args, **kwargs)
        if tied_across and (holds_first or holds_last):
            dist.all_reduce(named["tok_embeddings.weight"].grad, group=tied_group)
        squares = torch.zeros((), dtype=torch.float64, device=device)
        for p in counted:
            if p.grad is not None:
                squares += p.grad.double().pow(2).sum()
        dist.all_reduce(squares)
        factor = clip_factor(float(squares.sqrt()), config["clip"])
        if factor != 1.0:
            for p in named.values():
                if p.grad is not None:
                    p.grad.mul_(factor)
        if optimizer is not None:
            optimizer.step()
        step_ms, peak = meter.end_step()
        actions_ms = clock.take()
        # The balance loss, as a user logs it: this rank's stages' terms, summed over the ranks.
        aux = sum((term.double() for module in modules for term in module.balance_terms),
                  torch.zeros((), dtype=torch.float64, device=device))
        for module in modules:
            module.balance_terms.clear()
        if balanced:
            dist.all_reduce(aux)
        loss = float(sum(l.detach().double() for l in losses)) + float(aux) if holds_last else None
        grads = {name: p.grad for name, p in named.items() if p.grad is not None}
        exchange.save_step(step, grads, named, loss=loss, step_ms=step_ms, peak_bytes=peak, actions_ms=actions_ms,
                           boundaries=taps.end_step(),
                           aux_loss=float(aux) if balanced and holds_last else None,
                           expert_biases=balancer.biases() if balancer else None,
                           expert_counts=balancer.moved if balancer else None)
        if holds_last:
            print(f"pipecheck progress: step {step + 1}/{config['steps']} loss {loss:.6g}", flush=True)
    if resume.get("save"):
        import torch.distributed.checkpoint as dcp
        dcp.save(checkpoint_state(named, optimizer, balancer, config["steps"]), checkpoint_id=resume["save"])
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
