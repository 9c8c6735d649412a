#!/usr/bin/env python3
"""DeepSpeed's pipeline engine as a trainer under test (`trainer=deepspeed`), speaking pipecheck's
external-trainer protocol (protocol.py, docs/protocol.md).

Each rank does what a DeepSpeed pipeline user writes: docs/design.md §2's model (protocol.py's
modules) as a list of DeepSpeed `LayerSpec`s (the token embedding a `TiedLayerSpec` when the head
is tied, its head use a `forward_fn`), a `PipelineModule` over them with the scenario's partition,
`deepspeed.initialize` with the reference's AdamW as the client optimizer and a DeepSpeed config
(micro batch, gradient accumulation steps = microbatches x accumulation rounds, gradient clipping,
fp32), and one `engine.train_batch(data_iter)` per step. DeepSpeed does everything a step does, its
way: its 1F1B `TrainSchedule`, activations and gradients over its p2p layer, the loss per
microbatch scaled by 1/GAS, the tied weight's gradients summed between its stages, the
data-parallel average over its `PipeDataParallelTopology`, the clip, the optimizer step.

What pipecheck adds is only around it: the data iterator (pipecheck's batches, microbatch by
microbatch, each with its sequences' lengths so every stage masks the padded keys), the `loss_fn`
a DeepSpeed user writes for the scenario's loss normalisation, an optimizer step pre-hook that
reads the gradients DeepSpeed is about to apply (after the tied sum, the data-parallel average and
the clip) and a post-hook for the updated weights.

Loss normalisation (config.json's `loss`): DeepSpeed divides each microbatch's loss by GAS and
the replicas' gradients by their number. Under `microbatch_mean` (DeepSpeed's default) `loss_fn`
is the plain token-mean cross entropy of the microbatch, so the step averages the microbatches'
means exactly as DeepSpeed's users get it. Under `tokens` it returns the microbatch's summed cross
entropy x GAS x replicas / the step's labelled tokens: what a user who wants the token mean over
the whole batch must write, since DeepSpeed's own scaling stays on.

Layouts: one stage per rank (DeepSpeed's placement); schedule 1f1b. The protocol's processes are
DeepSpeed's global ranks: global rank g is stage g // replicas of replica g % replicas (its
topology), which writes into pipecheck's folder rank{replica x world_size + stage}.

No CPU shim: with DS_ACCELERATOR=cpu DeepSpeed runs over Gloo as it ships.
"""
import os
import re
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from protocol import ActionClock, Block, Exchange, Meter, Norm, ffn_size, make_optimizer  # noqa: E402

FAULTS = {
    "none": "DeepSpeed as it ships",
    "skip_tied_reduce": "the tied embedding's gradients are not summed between its two stages "
                        "(PipelineEngine._exec_reduce_tied_grads skipped; deepspeedai/DeepSpeed #7208's class)",
    "accumulation_scaled_twice": "every stage but the last scales the gradient it is handed by 1/GAS again before "
                                 "its backward, as DeepSpeed's tensor.backward hooks did (deepspeedai/DeepSpeed #8152)",
    "default_loss": "DeepSpeed's default loss path (each microbatch's token mean, averaged: microbatch_mean) "
                    "whatever the scenario's loss",
}
IGNORE_INDEX = -100


def key_mask(lengths, t, device):
    """Causal attention over each sequence's own keys (design §2: padded keys masked)."""
    positions = torch.arange(t, device=device)
    keep = (positions[:, None] >= positions[None, :])[None, None]
    return keep & (positions[None, None, None, :] < lengths[:, None, None, None])


class TokenEmbedding(nn.Embedding):
    """The token embedding; as a DeepSpeed tied layer, its weight is also the head's."""

    def forward(self, inputs):
        tokens, lengths = inputs
        return super().forward(tokens), lengths


class PositionEmbedding(nn.Embedding):
    """gpt2's learned positions, added to the embedded tokens."""

    def forward(self, inputs):
        h, lengths = inputs
        return h + super().forward(torch.arange(h.shape[1], device=h.device)), lengths


class Layer(Block):
    """One transformer block, passing the lengths on so the next stage masks the same keys."""

    def forward(self, inputs):
        h, lengths = inputs
        return super().forward(h, key_mask(lengths, h.shape[1], h.device)), lengths


class FinalNorm(Norm):
    def forward(self, inputs):
        h, _ = inputs
        return super().forward(h)


class Head(nn.Linear):
    pass


def tied_head(embedding, h):
    """The tied head: the embedding's weight as the output projection (TiedLayerSpec forward_fn)."""
    return F.linear(h, embedding.weight)


def tied_embedding(embedding, inputs):
    return embedding(inputs)


def layer_specs(model):
    """The model as DeepSpeed layer specs, with each spec's pipecheck name prefix."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    flavor, hidden, vocab = model["flavor"], model["hidden"], model["vocab"]
    specs, names = [], []
    if model["tied"]:
        specs.append(TiedLayerSpec("embed", TokenEmbedding, vocab, hidden, forward_fn=tied_embedding,
                                   tied_weight_attr=["weight"]))
    else:
        specs.append(LayerSpec(TokenEmbedding, vocab, hidden))
    names.append("tok_embeddings.")
    if flavor == "gpt2":
        specs.append(LayerSpec(PositionEmbedding, model["seq_len"], hidden))
        names.append("pos_embeddings.")
    for i in range(model["layers"]):
        specs.append(LayerSpec(Layer, flavor, hidden, model["heads"], ffn_size(model), model.get("kv_heads")))
        names.append(f"layers.{i}.")
    specs.append(LayerSpec(FinalNorm, flavor, hidden))
    names.append("norm.")
    if model["tied"]:
        specs.append(TiedLayerSpec("embed", TokenEmbedding, vocab, hidden, forward_fn=tied_head,
                                   tied_weight_attr=["weight"]))
        names.append("tok_embeddings.")
    else:
        specs.append(LayerSpec(Head, hidden, vocab, bias=False))
        names.append("output.")
    return specs, names


def parts_of(config):
    """config.json's partition as DeepSpeed's `parts`: stage s builds specs parts[s] .. parts[s+1]."""
    model = config["model"]
    first_layer_spec = 2 if model["flavor"] == "gpt2" else 1
    parts = [0]
    for stage in config["stages"]:
        end = first_layer_spec + stage["layers"][1]
        if stage["head"]:
            end += 2  # the final norm and the head
        parts.append(end)
    return parts


def make_pipeline_module_class():
    from deepspeed.pipe import PipelineModule

    class ExplicitPartition(PipelineModule):
        """A PipelineModule whose stages are exactly config.json's: DeepSpeed's partition methods
        (uniform, parameters, type:REGEX) balance counts and cannot express every split, so this
        sets the parts and bounds the same way its own _partition_layers does."""

        def __init__(self, *args, parts, **kwargs):
            self.explicit_parts = parts
            super().__init__(*args, **kwargs)

        def _partition_layers(self, method="uniform"):
            self.parts = list(self.explicit_parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    return ExplicitPartition


def main():
    exchange = Exchange()
    config = exchange.config
    if exchange.refuses_fault(FAULTS, "deepspeed_adapter"):
        return 2
    device = exchange.device()
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    except ImportError as error:
        print(f"deepspeed_adapter: DeepSpeed is not installed in {sys.executable} ({error})", file=sys.stderr)
        return 2
    meter = Meter(device)
    model = config["model"]
    stages, replicas = config["world_size"], config.get("data_parallel", 1)
    rounds, microbatches = config.get("accumulation", 1), config["microbatches"]
    gas = rounds * microbatches
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    topology = PipeDataParallelTopology(num_pp=stages, num_dp=replicas)
    global_rank = dist.get_rank()
    coord = topology.get_coord(global_rank)
    stage, replica = coord.pipe, coord.data
    exchange.write_as(replica * stages + stage)

    labelled = {"tokens": 1}
    token_mean = config.get("loss", "tokens") == "tokens" and exchange.fault != "default_loss"

    def loss_fn(logits, labels):
        as_loss = logits if logits.dtype == torch.float64 else logits.float()
        flat_logits, flat_labels = as_loss.reshape(-1, as_loss.shape[-1]), labels.reshape(-1)
        if not token_mean:
            return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX)
        summed = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return summed * (gas * replicas / labelled["tokens"])

    specs, prefixes = layer_specs(model)
    module = make_pipeline_module_class()(specs, topology=topology, loss_fn=loss_fn, parts=parts_of(config),
                                         dynamic_shape=True, partition_method="uniform")
    module = module.to(exchange.dtype)

    def global_name(name):
        if name.startswith("tied_modules.embed."):
            return "tok_embeddings." + name[len("tied_modules.embed."):]
        index, rest = re.match(r"(\d+)\.(.*)", name).groups()
        return prefixes[int(index)] + rest

    named = {global_name(name): p for name, p in module.named_parameters()}
    weights = exchange.weights()
    with torch.no_grad():
        for name, parameter in named.items():
            parameter.copy_(weights[name].to(parameter.dtype))
    module.to(device)
    exchange.save_start(named)

    sizes = config["microbatch_sizes"]
    micro = max(sizes)
    ds_config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
                 "train_batch_size": micro * gas * replicas, "gradient_clipping": config["clip"],
                 "fp16": {"enabled": False}, "bf16": {"enabled": config["dtype"] == "bfloat16"},
                 "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9,
                 "pipeline": {"activation_checkpoint_interval": 0}}
    optimizer = make_optimizer(config, list(named.values()))
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, model_parameters=None, config=ds_config)
    # The engine runs each schedule instruction through its class's _INSTRUCTION_MAP: a fault
    # replaces an entry in this engine's own copy of it.
    from deepspeed.runtime.pipe import schedule
    instructions = engine._INSTRUCTION_MAP = dict(engine._INSTRUCTION_MAP)
    if exchange.fault == "skip_tied_reduce":
        instructions[schedule.ReduceTiedGrads] = lambda self, **kwargs: None
    if exchange.fault == "accumulation_scaled_twice":
        backward = engine._exec_backward_pass

        def scaled_again(buffer_id):
            if not engine.is_last_stage():
                handed = engine.grad_layer
                engine.grad_layer = (tuple(g / gas for g in handed) if isinstance(handed, (tuple, list))
                                     else handed / gas)
            backward(buffer_id)

        instructions[schedule.BackwardPass] = lambda self, buffer_id: scaled_again(buffer_id)
    # Where the step's time goes, timed around the engine's own instructions (on the CPU): its
    # ForwardPass (the loss on the last stage included) F, BackwardPass B, sends COMM and receives
    # WAIT (DeepSpeed's p2p receive blocks until its tensor is there); loading microbatches, the
    # gradient reductions and the optimizer step are the step's other work.
    clock = ActionClock()
    if device.type == "cpu":
        kinds = {schedule.ForwardPass: "F", schedule.BackwardPass: "B", schedule.SendActivation: "COMM",
                 schedule.SendGrad: "COMM", schedule.RecvActivation: "WAIT", schedule.RecvGrad: "WAIT"}
        for instruction, kind in kinds.items():
            instructions[instruction] = clock.timed(lambda a, k, kind=kind: kind, instructions[instruction])
    # The gradients the optimizer applies, read just before its step (after DeepSpeed's tied sum,
    # data-parallel average and clip): through safe_get_full_grad, which under bf16 reads the
    # float32 accumulation its BF16_Optimizer steps with, not the bfloat16 staging gradient.
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad
    bf16 = config["dtype"] == "bfloat16"
    observed = {}

    def applied(*args):
        grads = {name: safe_get_full_grad(p) for name, p in named.items()}
        observed["grads"] = {name: g.detach().clone() for name, g in grads.items() if g is not None}

    optimizer.register_step_pre_hook(applied)

    # A stretch of a resumed run (config.json's "resume"): DeepSpeed's own checkpointing, as its
    # users resume: engine.load_checkpoint from the previous stretch's folder before the first step
    # (the data position in its client_state), engine.save_checkpoint into this stretch's after
    # the last; the weights loaded are what start.pt hands back.
    resume = config.get("resume") or {}
    first_step = int(resume.get("first_step", 0))
    if resume.get("load"):
        path, client_state = engine.load_checkpoint(resume["load"], tag=f"step{first_step}")
        if path is None:
            print(f"deepspeed_adapter: DeepSpeed found no checkpoint step{first_step} in {resume['load']}",
                  file=sys.stderr)
            return 1
        if (client_state or {}).get("next_step") != first_step:
            print(f"deepspeed_adapter: the checkpoint's client_state says next_step "
                  f"{(client_state or {}).get('next_step')}, not {first_step}", file=sys.stderr)
            return 1
        exchange.save_start(named)

    # This replica's microbatches of the step, in DeepSpeed's (inputs, labels) form.
    first = replica * gas
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    for step in range(first_step, config["steps"]):
        batch = exchange.batch(step)
        labelled["tokens"] = int((batch["labels"] != IGNORE_INDEX).sum())
        items = []
        for m in range(first, first + gas):
            rows = slice(starts[m], starts[m + 1])
            lengths = batch["lengths"][rows]
            t = int(lengths.max())
            items.append(((batch["tokens"][rows, :t].to(device), lengths.to(device)),
                          batch["labels"][rows, :t].to(device)))
        observed.clear()
        dist.barrier()
        meter.start_step()
        clock.take()
        loss = engine.train_batch(iter(items))
        step_ms, peak = meter.end_step()
        actions_ms = clock.take()
        # The weights the model holds after the step (under bf16, copied back from the float32
        # master weights once the optimizer has stepped).
        observed["weights"] = {name: p.detach().clone() for name, p in named.items()}
        # Under bf16 the float32 master weights its BF16_Optimizer stepped, for the update judge.
        master = {name: safe_get_full_fp32_param(p) for name, p in named.items()} if bf16 else None
        holds_loss = engine.is_last_stage() and replica == 0
        exchange.save_step(step, observed["grads"], observed["weights"], loss=float(loss) if holds_loss else None,
                           step_ms=step_ms, peak_bytes=peak, master_weights=master, actions_ms=actions_ms)
        if holds_loss:
            print(f"pipecheck progress: step {step + 1}/{config['steps']} loss {float(loss):.6g}", flush=True)
    if resume.get("save"):
        engine.save_checkpoint(resume["save"], tag=f"step{config['steps']}", client_state={"next_step": config["steps"]})
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
