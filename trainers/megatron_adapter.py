#!/usr/bin/env python3
"""Megatron-Core as a trainer under test (`trainer=megatron`), speaking pipecheck's external-trainer
protocol (protocol.py, docs/protocol.md).

Each rank does what a Megatron-Core user writes (Megatron-LM's pretrain_gpt.py and
megatron/training/training.py, without their argument parsing): `initialize_model_parallel` with
the scenario's pipeline, virtual pipeline and data-parallel sizes, Megatron's own `GPTModel` built
from a `TransformerConfig` and the local layer spec (`get_gpt_layer_local_spec`: its RMSNorm,
SwiGLU MLP, rotary and `DotProductAttention`, no Transformer Engine), one model chunk per virtual
stage, each wrapped in Megatron's `DistributedDataParallel` (Float16Module first for bfloat16),
its optimizer (`get_megatron_optimizer`: AdamW or SGD, clipping inside the step) with its
`OptimizerParamScheduler` at a constant rate, `finalize_model_grads` as the config's gradient
finaliser (the data-parallel reduction, the tied embedding/head all-reduce, the division by the
step's labelled tokens) and `get_forward_backward_func()`'s schedule: 1F1B
(`forward_backward_pipelining_without_interleaving`) or interleaved 1F1B. A step is
training.py's train_step: zero the grad buffers, run the schedule, `optimizer.step()`, the
scheduler's step, the logged loss reduced over the microbatches and replicas. Where
TransformerConfig's defaults differ from what Megatron-LM's arguments.py configures for training,
the adapter takes Megatron-LM's: the interleaved schedule's p2p communication overlapped and
unbatched (Megatron-LM refuses TransformerConfig's batched default there at pipeline size 2; fault
core_p2p_defaults runs it), and 1F1B's pipeline outputs freed once sent. One setting departs from
Megatron-LM's: under the interleaved schedule the outputs are kept (`deallocate_pipeline_outputs`
off, TransformerConfig's own default), because Megatron-Core 0.16.1 frees an output while its
overlapped send is still in flight (NVIDIA/Megatron-LM#4047, fixed after 0.16.1); whether the
freed memory is reused before the send reads it depends on timing, so the released setting
trains on another microbatch's activations now and then, on a loaded machine: over Gloo a send
whose receive is not yet posted reads its memory only when the receive arrives.

The scenario's columns map onto that configuration: schedule (1f1b; interleaved with
virtual_stages > 1), world_size (pipeline_model_parallel_size), partition (the layout below),
data_parallel (the replicas initialize_model_parallel makes of the processes), microbatches
(num_microbatches; accumulation rounds, where given, run as more microbatches), tied
(share_embeddings_and_output_weights), clip (clip_grad; 0 is off), optimizer (AdamW with the
reference's settings, or SGD without momentum), dtype (float32, or bfloat16 through Float16Module
and the fp32-main-weight optimizer), loss (below).

A stretch of a resumed run (config.json's "resume") saves and loads Megatron's distributed
checkpoint as Megatron-LM's checkpointing does for its torch_dist format (checkpoint_state,
load_checkpoint): sharded by global parameter, so another pipeline layout loads it.

What pipecheck adds is only around it:

- the partition: config.json's stages as `pipeline_model_parallel_layout` (stage s of rank r,
  virtual stage v = s // world_size, is entry v x world_size + r: "embedding", a "decoder" per
  layer, "loss" for the final norm and head), which expresses uneven, embedding-only and empty
  stages; the chunks Megatron built are checked against the stages;
- the data: a forward step function shaped as pretrain_gpt's (`forward_step` and `loss_func`,
  returning the summed loss, its token count and the report), fed pipecheck's microbatches, each
  padded to its own longest sequence, with labels -100 turned into Megatron's loss mask and the
  padded keys masked out of attention (causal and key padding, True = masked, as
  `DotProductAttention` takes it); every stage's forward gets its microbatch's mask;
  `variable_seq_lengths` lets the schedule send each microbatch's own shape;
- the loss normalisation: config.json's "loss" "microbatch_mean" is Megatron's default
  (`calculate_per_token_loss=False`: each microbatch's token mean, averaged over the
  microbatches and replicas); anything else is pipecheck's token mean
  (`calculate_per_token_loss=True`: summed cross entropy, gradients divided by the step's
  labelled tokens in finalize_model_grads);
- the weights: pipecheck's names mapped onto Megatron's (`linear_qkv` holds each query group's
  query heads, then its key and value head; `linear_fc1` is the gate w1 above w3; rotary is
  rotate-half in both, so no row permutation); the tied head on the last stage is reported as
  tok_embeddings.weight too;
- the observation: a step pre-hook on the optimizer Megatron steps (its torch optimizer) reads
  the gradients it applies (main_grad after the reductions and the clip; for bfloat16 the fp32
  main parameters' gradients), the weights are read after `optimizer.step()`.

Processes: Megatron's rank order "tp-cp-ep-dp-pp" makes global rank g pipeline rank
g // data_parallel and replica g % data_parallel (read back from parallel_state, not assumed);
each writes into pipecheck's folder rank{replica x world_size + pipeline rank}.

CPU shims: Megatron-Core assumes CUDA in a few places; `cpu_shims` (the one marked place, applied
only for device=cpu) makes each work on the CPU without changing what is computed.
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from protocol import ActionClock, Exchange, Meter  # noqa: E402

# The scenario's `fault`: Megatron-Core as it ships, or a bug planted in its gradient path as a
# control that pipecheck must catch.
FAULTS = {
    "none": "Megatron-Core as it ships",
    "skip_tied_reduce": "a control: the tied embedding/head gradient all-reduce between the first and last stage "
                        "skipped (finalize_model_grads' _allreduce_word_embedding_grads does nothing)",
    "accumulation_scaled_twice": "a control in DeepSpeed #8152's shape: every stage but the last divides its "
                                 "accumulated gradients by the microbatch count once more",
    "core_p2p_defaults": "not a planted bug: Megatron-Core's own TransformerConfig p2p defaults (batch_p2p_comm=True, "
                         "overlap_p2p_comm=False) instead of Megatron-LM's training settings; with the interleaved "
                         "schedule at pipeline size 2 its batched sends to the one peer pair up crosswise "
                         "(NVIDIA/Megatron-LM#750, #1450), which Megatron-LM's argument check refuses",
    "default_loss": "Megatron's default loss normalisation (calculate_per_token_loss=False: the microbatches' token "
                    "means averaged) whatever the scenario's loss",
    "no_load_optim": "a control: at a resume the model is loaded but the optimizer's state is not (Megatron-LM's "
                     "--no-load-optim), so AdamW starts afresh",
}
SCHEDULES = ("1f1b", "interleaved")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # Megatron-Core has no float64 path
IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------
# CPU SHIMS: the one place this adapter changes Megatron-Core, applied only for device=cpu. Each
# stands in for a CUDA call Megatron hard-codes; none changes what a step computes.
# ---------------------------------------------------------------------------------------------
def cpu_shims():
    """Must run before Megatron builds anything (shim 1's mode stays on for the whole run)."""
    from torch.overrides import TorchFunctionMode

    def names_cuda(device):
        if isinstance(device, bool):
            return False
        if isinstance(device, int):  # a bare index is a CUDA device to torch
            return True
        if isinstance(device, str):
            return device.startswith("cuda")
        return isinstance(device, torch.device) and device.type == "cuda"

    # 1. CUDA by name. Megatron allocates its bookkeeping tensors on "cuda" or on
    #    torch.cuda.current_device() (the schedules' token counts, the p2p shape and receive
    #    buffers, the grad buffers, the optimizers' unit scale, the grad norm) and moves the tied
    #    head and the rotary frequencies there with .cuda() / .to(device=index); its optimizers also
    #    classify parameters by CUDA type name (Float16OptimizerWithFloat16Params:
    #    'torch.cuda.BFloat16Tensor' / 'torch.cuda.FloatTensor'; clip_grad_by_total_norm_fp32
    #    asserts 'torch.cuda.FloatTensor'). This mode puts those tensors on the CPU, leaves .cuda()
    #    where the tensor is, and answers Tensor.type() with the CUDA name of the same dtype.
    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name.replace("torch.", "torch.cuda.", 1) if args[0].device.type == "cpu" else name
            if "device" in kwargs and names_cuda(kwargs["device"]):
                kwargs = dict(kwargs, device="cpu")
            return func(*args, **kwargs)

    CudaOnCpu().__enter__()

    # 2. The current device and stream synchronisation: index 0 (which shim 1 maps to the CPU);
    #    synchronising is a no-op, CPU ops having finished when they return.
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *args, **kwargs: None

    # 3. The CUDA RNG tracker (tensor_parallel.random: model_parallel_cuda_manual_seed, and the
    #    fork every attention forward takes around its dropout) saves, seeds and restores the CUDA
    #    generator; here it does so with the CPU generator.
    from megatron.core.tensor_parallel import random as megatron_random
    torch.cuda.manual_seed = torch.manual_seed
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    megatron_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
# ------------------------------------------------------------------------------- end of shims


def layout_of(config):
    """config.json's stages as Megatron's pipeline_model_parallel_layout: entry v x P + r is rank
    r's virtual stage v, Megatron's interleaved placement (stage s on rank s % P). A placement
    it cannot express is refused."""
    world, stages = config["world_size"], config["stages"]
    layout = [None] * len(stages)
    for stage in stages:
        s = stage["stage"]
        if stage["rank"] != s % world:
            raise SystemExit(f"megatron_adapter: Megatron places stage s on pipeline rank s % {world}; "
                             f"pipecheck's placement for schedule {config['schedule']} puts stage {s} on rank "
                             f"{stage['rank']}")
        entry = ["embedding"] if stage["embedding"] else []
        entry += ["decoder"] * (stage["layers"][1] - stage["layers"][0])
        entry += ["loss"] if stage["head"] else []
        layout[s] = entry
    return layout


def transformer_config(config, loss_mode, core_p2p_defaults=False):
    """The scenario's llama as Megatron's TransformerConfig, partitioned as config.json says, with
    Megatron-LM's p2p settings (or, for fault core_p2p_defaults, TransformerConfig's own)."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    model, dtype = config["model"], DTYPES[config["dtype"]]
    hidden, heads = model["hidden"], model["heads"]
    virtual = config["virtual_stages"]
    overlap_p2p = virtual > 1
    p2p = {} if core_p2p_defaults else {"overlap_p2p_comm": overlap_p2p, "batch_p2p_comm": not overlap_p2p}
    # Megatron-LM frees each pipeline output once it is sent. With overlapped sends Megatron-Core
    # 0.16.1 frees it before the send completes (NVIDIA/Megatron-LM#4047), so there the outputs are
    # kept; batched sends (1F1B, and core_p2p_defaults) are waited on before the free.
    deallocate = not overlap_p2p or core_p2p_defaults
    return TransformerConfig(
        num_layers=model["layers"], hidden_size=hidden, ffn_hidden_size=model["ffn"],
        num_attention_heads=heads, num_query_groups=model.get("kv_heads", heads), kv_channels=hidden // heads,
        normalization="RMSNorm", layernorm_epsilon=1e-5, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=False, hidden_dropout=0.0, attention_dropout=0.0,
        pipeline_model_parallel_size=config["world_size"],
        virtual_pipeline_model_parallel_size=virtual if virtual > 1 else None,
        pipeline_model_parallel_layout=layout_of(config),
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
        # variable_seq_lengths: each microbatch sends its own shape. Megatron's validation refuses
        # it with the default MoE token dispatcher ("allgather") even in a model without experts,
        # so the dispatcher is named; no layer here uses it.
        variable_seq_lengths=True, moe_token_dispatcher_type="alltoall",
        calculate_per_token_loss=loss_mode != "microbatch_mean",
        # Megatron-LM's training settings (arguments.py): the interleaved schedule overlaps its p2p
        # communication, unbatched, and 1F1B batches it; pipeline outputs freed once sent (above).
        deallocate_pipeline_outputs=deallocate, **p2p,
        use_cpu_initialization=config["device"] == "cpu")


def build_chunks(config, transformer):
    """Megatron's GPTModel, one per virtual stage of this rank, as training.get_model builds them."""
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    model = config["model"]
    virtual = config["virtual_stages"]
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    chunks = []
    for v in range(virtual):
        vp_stage = v if virtual > 1 else None
        chunk = GPTModel(
            config=transformer, transformer_layer_spec=spec, vocab_size=model["vocab"],
            max_sequence_length=model["seq_len"],
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=bool(model["tied"]), position_embedding_type="rope",
            rotary_percent=1.0, rotary_base=10000, vp_stage=vp_stage)
        chunk.model_type = ModelType.encoder_or_decoder
        chunk.vp_stage = vp_stage
        chunks.append(chunk)
    return chunks


def check_placement(config, chunks, pp_rank):
    """Each chunk Megatron built holds the stage config.json puts there: its layers (Megatron's
    layer numbers are global, from 1), its embedding and its head."""
    world = config["world_size"]
    for v, chunk in enumerate(chunks):
        stage = config["stages"][v * world + pp_rank]
        layers = [layer.layer_number - 1 for layer in chunk.decoder.layers]
        held = (layers, chunk.pre_process, chunk.post_process)
        expected = (list(range(*stage["layers"])), stage["embedding"], stage["head"])
        if held != expected:
            raise SystemExit(f"megatron_adapter: Megatron built (layers, embedding, head) {held} on pipeline rank "
                             f"{pp_rank}, virtual stage {v}; pipecheck's stage {stage['stage']} is {expected}")


class Names:
    """pipecheck's names <-> one chunk's Megatron names, with the fused tensors split and joined."""

    def __init__(self, chunk, model):
        self.tied = bool(model["tied"])
        self.heads, self.groups = model["heads"], model.get("kv_heads", model["heads"])
        self.head_dim = model["hidden"] // model["heads"]
        self.layer_of = {j: layer.layer_number - 1 for j, layer in enumerate(chunk.decoder.layers)}

    def join_qkv(self, wq, wk, wv):
        """[q heads of group 0; k_0; v_0; q heads of group 1; ...] rows, as linear_qkv holds them."""
        per_group, d = self.heads // self.groups, self.head_dim
        q = wq.reshape(self.groups, per_group * d, -1)
        k = wk.reshape(self.groups, d, -1)
        v = wv.reshape(self.groups, d, -1)
        return torch.cat([q, k, v], dim=1).reshape(-1, wq.shape[-1])

    def split_qkv(self, qkv):
        per_group, d = self.heads // self.groups, self.head_dim
        grouped = qkv.reshape(self.groups, (per_group + 2) * d, -1)
        q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
        return q.reshape(-1, qkv.shape[-1]), k.reshape(-1, qkv.shape[-1]), v.reshape(-1, qkv.shape[-1])

    def parts(self, name):
        """The pipecheck names Megatron parameter `name` holds (three for linear_qkv, two for
        linear_fc1, in their fused order)."""
        if name == "embedding.word_embeddings.weight":
            return ["tok_embeddings.weight"]
        if name == "output_layer.weight":
            return ["tok_embeddings.weight" if self.tied else "output.weight"]
        if name == "decoder.final_layernorm.weight":
            return ["norm.weight"]
        if name.startswith("decoder.layers."):
            j, rest = name[len("decoder.layers."):].split(".", 1)
            prefix = f"layers.{self.layer_of[int(j)]}."
            if rest == "self_attention.linear_qkv.weight":
                return [f"{prefix}attention.{part}.weight" for part in ("wq", "wk", "wv")]
            if rest == "mlp.linear_fc1.weight":
                return [f"{prefix}feed_forward.{part}.weight" for part in ("w1", "w3")]
            if rest in LAYER_NAMES:
                return [prefix + LAYER_NAMES[rest]]
        raise SystemExit(f"megatron_adapter: Megatron's parameter {name} has no pipecheck name")

    def to_pipecheck(self, tensors):
        """{Megatron name: tensor} of one chunk -> {pipecheck name: tensor}."""
        out = {}
        for name, t in tensors.items():
            parts = self.parts(name)
            if len(parts) == 3:
                values = self.split_qkv(t)
            elif len(parts) == 2:
                values = t.chunk(2, dim=0)
            else:
                values = [t]
            out.update(zip(parts, values))
        return out

    def to_megatron(self, name, weights):
        """The value of Megatron parameter `name` from pipecheck's {name: tensor}."""
        values = [weights[part] for part in self.parts(name)]
        if len(values) == 3:
            return self.join_qkv(*values)
        return torch.cat(values, dim=0) if len(values) == 2 else values[0]


LAYER_NAMES = {"input_layernorm.weight": "attention_norm.weight",
               "pre_mlp_layernorm.weight": "ffn_norm.weight",
               "self_attention.linear_proj.weight": "attention.wo.weight",
               "mlp.linear_fc2.weight": "feed_forward.w2.weight"}


def microbatches_of(batch, sizes, first, count, device):
    """This replica's microbatches of the step (microbatch_sizes[first : first + count]), each cut
    to its own longest sequence: tokens, positions, the attention mask (True = masked: a later
    position or a padded key), labels with Megatron's loss mask in place of -100."""
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    items = []
    for m in range(first, first + count):
        rows = slice(starts[m], starts[m + 1])
        lengths = batch["lengths"][rows]
        t = int(lengths.max())
        tokens = batch["tokens"][rows, :t]
        labels = batch["labels"][rows, :t]
        positions = torch.arange(t)
        keep = ((positions[:, None] >= positions[None, :])[None, None]
                & (positions[None, None, None, :] < lengths[:, None, None, None]))
        loss_mask = labels != IGNORE_INDEX
        item = {"tokens": tokens, "positions": positions.expand(len(lengths), t).contiguous(),
                "attention_mask": ~keep, "labels": labels.masked_fill(~loss_mask, 0), "loss_mask": loss_mask.float()}
        items.append({key: value.to(device) for key, value in item.items()})
    return items


def loss_func(loss_mask, output_tensor):
    """pretrain_gpt's loss_func: the microbatch's summed token loss, its token count and the report
    the training loop reduces (the schedule divides by the tokens and microbatches unless
    calculate_per_token_loss)."""
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
    return loss, num_tokens, report


def forward_step(data_iterator, model):
    """pretrain_gpt's forward_step: the model's per-token losses and loss_func on its loss mask. Every
    stage draws its microbatch, so each masks that microbatch's padded keys."""
    item = next(data_iterator)
    output = model(item["tokens"], item["positions"], item["attention_mask"], labels=item["labels"],
                   loss_mask=item["loss_mask"])
    return output, functools.partial(loss_func, item["loss_mask"])


def reported_loss(losses_reduced, loss_mode, dp_group):
    """The step's loss from the last stage's reports, as training.train_step reduces them: summed
    losses over summed tokens across microbatches and replicas (pipecheck's token mean); for
    microbatch_mean, the mean of the microbatches' token means, as its gradients are."""
    values = torch.stack([report["lm loss"].view(-1) for report in losses_reduced]).double()
    if loss_mode == "microbatch_mean":
        mean = (values[:, 0] / values[:, 1].clamp(min=1)).mean().view(1)
        dist.all_reduce(mean, group=dp_group)
        return float(mean) / dist.get_world_size(dp_group)
    total = values.sum(dim=0)
    dist.all_reduce(total, group=dp_group)
    return float(total[0] / total[1])


def refusal(config):
    """Why Megatron-Core, as this adapter drives it, cannot run the scenario (None: it can)."""
    model = config["model"]
    if config["dtype"] not in DTYPES:
        return f"Megatron-Core trains in float32 or bfloat16 (no float64 path); this scenario is {config['dtype']}"
    if model["flavor"] != "llama":
        return f"this adapter builds Megatron's GPTModel as a llama; flavor {model['flavor']!r} has no mapping here"
    if config["schedule"] not in SCHEDULES or (config["schedule"] == "interleaved") != (config["virtual_stages"] > 1):
        return (f"Megatron-Core's schedules are 1F1B (one stage per rank) and interleaved 1F1B (virtual stages); "
                f"this scenario is {config['schedule']} with {config['virtual_stages']} stage(s) per rank")
    if config["optimizer"]["name"] not in ("adamw", "sgd"):
        return f"no Megatron optimizer for {config['optimizer']['name']!r}"
    return None


def make_optimizer(config, transformer, chunks):
    """Megatron's optimizer over the chunks with the reference's settings (AdamW, or SGD without
    momentum), the clip inside its step, and its scheduler holding rate and decay constant."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    settings, lr = config["optimizer"], config["optimizer"]["lr"]
    common = dict(lr=lr, min_lr=lr, clip_grad=config["clip"], bf16=transformer.bf16,
                  params_dtype=transformer.params_dtype)
    if settings["name"] == "adamw":
        optimizer_config = OptimizerConfig(optimizer="adam", weight_decay=settings["weight_decay"],
                                           adam_beta1=settings["betas"][0], adam_beta2=settings["betas"][1],
                                           adam_eps=settings["eps"], decoupled_weight_decay=True, **common)
    else:
        optimizer_config = OptimizerConfig(optimizer="sgd", weight_decay=0.0, sgd_momentum=0.0, **common)
    # config_overrides={}: every parameter decays, norms included, as the reference's AdamW does
    # (None would give Megatron's default of no decay on biases and 1-D parameters).
    optimizer = get_megatron_optimizer(optimizer_config, chunks, config_overrides={})
    wd = optimizer_config.weight_decay
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=lr, max_lr=lr, min_lr=lr, lr_warmup_steps=0, lr_decay_steps=config["steps"],
        lr_decay_style="constant", start_wd=wd, end_wd=wd, wd_incr_steps=config["steps"], wd_incr_style="constant")
    return optimizer, scheduler


def plant_fault(fault, transformer, raw, microbatches):
    """The control faults, planted in Megatron's gradient finalisation."""
    finalize_module = sys.modules["megatron.core.distributed.finalize_model_grads"]
    if fault == "skip_tied_reduce":
        finalize_module._allreduce_word_embedding_grads = lambda *args, **kwargs: None
    elif fault == "accumulation_scaled_twice":
        finalize = transformer.finalize_model_grads_func

        def finalize_scaled_twice(model_chunks, num_tokens, **kwargs):
            for chunk, module in zip(model_chunks, raw):
                if not module.post_process:
                    chunk.scale_gradients(1.0 / microbatches)
            return finalize(model_chunks, num_tokens, **kwargs)
        transformer.finalize_model_grads_func = finalize_scaled_twice


class AppliedGradients:
    """The gradients Megatron's optimizer applies, read in a step pre-hook on each torch optimizer
    it steps: main_grad after the reductions and the clip (under bfloat16, the fp32 main
    parameters' gradients, mapped back to the model's parameters), per chunk by Megatron name."""

    def __init__(self, optimizer, raw):
        self.owner, self.observed = {}, {}
        for c, chunk in enumerate(raw):
            for name, parameter in chunk.named_parameters():
                self.owner[id(getattr(parameter, "main_param", parameter))] = (c, name)
        for inner in optimizer.chained_optimizers:
            if getattr(inner, "optimizer", None) is not None:
                inner.optimizer.register_step_pre_hook(self._read)

    def _read(self, inner, *args):
        for group in inner.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    c, name = self.owner[id(parameter)]
                    self.observed.setdefault(c, {})[name] = parameter.grad.detach().clone()

    def take(self):
        observed, self.observed = self.observed, {}
        return observed


def checkpoint_state(chunks, optimizer, scheduler, iteration, is_loading=False, with_optimizer=True):
    """The state Megatron-LM's generate_state_dict makes for a torch_dist checkpoint, of the model
    chunks unwrapped as its save_checkpoint unwraps them (no DistributedDataParallel, no
    Float16Module)."""
    state = {}
    if len(chunks) == 1:
        state["model"] = chunks[0].sharded_state_dict()
    else:
        for i, chunk in enumerate(chunks):
            state[f"model{i}"] = chunk.sharded_state_dict()
    if with_optimizer:
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=is_loading)
        state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    return state


def load_checkpoint(folder, chunks, optimizer, scheduler, first_step, load_optimizer=True):
    """Megatron-LM's load_checkpoint for a torch_dist checkpoint, at this process's layout."""
    from megatron.core import dist_checkpointing
    loaded = dist_checkpointing.load(checkpoint_state(chunks, optimizer, scheduler, first_step, is_loading=True,
                                                      with_optimizer=load_optimizer), folder)
    if loaded["iteration"] != first_step:
        raise SystemExit(f"megatron_adapter: the checkpoint in {folder} is at iteration {loaded['iteration']}, "
                         f"not {first_step}")
    if len(chunks) == 1:
        chunks[0].load_state_dict(loaded["model"], strict=True)
    else:
        for i, chunk in enumerate(chunks):
            chunk.load_state_dict(loaded[f"model{i}"], strict=True)
    if load_optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
        scheduler.load_state_dict(loaded["opt_param_scheduler"])


class TimedWork:
    """A p2p request Megatron waits on later (the interleaved schedule's overlapped communication),
    its wait() timed as `kind`."""

    def __init__(self, work, clock, kind):
        self._work = work
        self.wait = clock.timed(lambda a, k: kind, work.wait)

    def __getattr__(self, name):
        return getattr(self._work, name)


def install_clock(clock):
    """Times Megatron-Core's schedules at their own functions (on the CPU; see protocol.py's
    ActionClock): schedules.forward_step (its loss included) F, schedules.backward_step B, and
    P2PCommunicator._communicate WAIT when it receives (a call that also sends, as 1F1B's fused
    send-and-receive, counts as a receive) and COMM when it only sends; requests it hands back
    unwaited (the interleaved schedule's overlap) are timed where the schedule waits on them, WAIT
    for a receive and COMM for a send. Times nothing where this release lacks one of them, so that
    no step reports a partial account."""
    from megatron.core.pipeline_parallel import p2p_communication, schedules
    communicator = getattr(p2p_communication, "P2PCommunicator", None)
    if not all(callable(getattr(owner, name, None)) for owner, name in
               [(schedules, "forward_step"), (schedules, "backward_step"), (communicator, "_communicate")]):
        return
    schedules.forward_step = clock.timed(lambda a, k: "F", schedules.forward_step)
    schedules.backward_step = clock.timed(lambda a, k: "B", schedules.backward_step)
    communicate = clock.timed(lambda a, k: "WAIT" if k.get("recv_prev") or k.get("recv_next") else "COMM",
                              communicator._communicate)

    def timed_communicate(self, **kwargs):
        received_prev, received_next, reqs = communicate(self, **kwargs)
        if isinstance(reqs, dict):
            reqs = {key: TimedWork(work, clock, "WAIT" if key.startswith("recv") else "COMM")
                    for key, work in reqs.items()}
        return received_prev, received_next, reqs
    communicator._communicate = timed_communicate


def main():
    exchange = Exchange()
    config = exchange.config
    if exchange.refuses_fault(FAULTS, "megatron_adapter"):
        return 2
    refused = refusal(config)
    if refused:
        print(f"megatron_adapter: {refused}", file=sys.stderr)
        return 2
    device = exchange.device()
    if device.type == "cpu":
        cpu_shims()
    else:
        torch.cuda.set_device(device)
    try:
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.module import Float16Module
    except ImportError as error:
        print(f"megatron_adapter: Megatron-Core is not installed in {sys.executable} ({error})", file=sys.stderr)
        return 2
    meter = Meter(device)
    clock = ActionClock()
    if device.type == "cpu":
        install_clock(clock)
    world, virtual = config["world_size"], config["virtual_stages"]
    replicas = config.get("data_parallel", 1)
    microbatches = config.get("accumulation", 1) * config["microbatches"]  # one replica's, per step
    # "microbatch_mean" (Megatron's default), or pipecheck's token mean ("tokens").
    default = exchange.fault == "default_loss"
    loss_mode = "microbatch_mean" if config.get("loss") == "microbatch_mean" or default else "tokens"

    dist.init_process_group(backend="gloo" if device.type == "cpu" else "nccl")
    try:
        parallel_state.initialize_model_parallel(
            pipeline_model_parallel_size=world, virtual_pipeline_model_parallel_size=virtual if virtual > 1 else None)
        tensor_parallel.model_parallel_cuda_manual_seed(config["seed"])
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        replica = parallel_state.get_data_parallel_rank()
        if parallel_state.get_data_parallel_world_size() != replicas:
            raise SystemExit(f"megatron_adapter: {dist.get_world_size()} processes make "
                             f"{parallel_state.get_data_parallel_world_size()} replicas; config.json says {replicas}")
        exchange.write_as(replica * world + pp_rank)

        transformer = transformer_config(config, loss_mode, core_p2p_defaults=exchange.fault == "core_p2p_defaults")
        raw = build_chunks(config, transformer)
        check_placement(config, raw, pp_rank)
        names = [Names(chunk, config["model"]) for chunk in raw]

        # pipecheck's weights into the chunks, before the optimizer copies them into its own.
        weights = exchange.weights()
        modules = [Float16Module(transformer, chunk) if transformer.bf16 else chunk for chunk in raw]
        with torch.no_grad():
            for chunk, chunk_names in zip(raw, names):
                for name, parameter in chunk.named_parameters():
                    parameter.copy_(chunk_names.to_megatron(name, weights).to(parameter.dtype))
        for module in modules:
            module.to(device)

        def held(tensors_of):
            out = {}
            for c, (chunk, chunk_names) in enumerate(zip(raw, names)):
                out.update(chunk_names.to_pipecheck(tensors_of(c, chunk)))
            return out
        exchange.save_start(held(lambda c, chunk: dict(chunk.named_parameters())))

        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                   use_distributed_optimizer=False)
        chunks = [DistributedDataParallel(config=transformer, ddp_config=ddp_config, module=module,
                                          disable_bucketing=i > 0)
                  for i, module in enumerate(modules)]
        optimizer, scheduler = make_optimizer(config, transformer, chunks)
        transformer.grad_scale_func = optimizer.scale_loss
        transformer.finalize_model_grads_func = finalize_model_grads
        plant_fault(exchange.fault, transformer, raw, microbatches)
        applied = AppliedGradients(optimizer, raw)

        # A stretch of a resumed run (config.json's "resume"): Megatron's distributed checkpoint as
        # Megatron-LM's checkpointing writes and reads it (torch_dist format): every chunk's sharded
        # state dict ("model", or "model0", "model1", ... with virtual stages), the optimizer's
        # sharded state over them, the scheduler's state and the iteration (the data position).
        resume = config.get("resume") or {}
        first_step = int(resume.get("first_step", 0))
        if resume.get("load"):
            load_checkpoint(resume["load"], raw, optimizer, scheduler, first_step,
                            load_optimizer=exchange.fault != "no_load_optim")
            exchange.save_start(held(lambda c, chunk: dict(chunk.named_parameters())))

        forward_backward = get_forward_backward_func()
        sizes = config["microbatch_sizes"]
        dp_group = parallel_state.get_data_parallel_group()
        holds_loss = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        for step in range(first_step, config["steps"]):
            batch = exchange.batch(step)
            items = microbatches_of(batch, sizes, replica * microbatches, microbatches, device)
            iterators = [iter(items) for _ in chunks]  # each chunk draws every microbatch
            dist.barrier()
            meter.start_step()
            clock.take()
            # One step as training.train_step runs it.
            for chunk in chunks:
                chunk.zero_grad_buffer()
            optimizer.zero_grad()
            losses_reduced = forward_backward(
                forward_step_func=forward_step, data_iterator=iterators if len(chunks) > 1 else iterators[0],
                model=chunks, num_microbatches=microbatches, seq_length=int(batch["lengths"].max()),
                micro_batch_size=max(sizes), forward_only=False)
            success, _, _ = optimizer.step()
            if not success:
                raise SystemExit(f"megatron_adapter: Megatron's optimizer skipped step {step}")
            scheduler.step(increment=1)
            loss = reported_loss(losses_reduced, loss_mode, dp_group) if holds_loss else None
            step_ms, peak = meter.end_step()
            actions_ms = clock.take()
            grads = applied.take()
            # Under bfloat16, the float32 main parameters its optimizer stepped, for the update judge.
            master = held(lambda c, chunk: {name: parameter.main_param
                                            for name, parameter in chunk.named_parameters()}) if transformer.bf16 else None
            exchange.save_step(step, held(lambda c, chunk: grads.get(c, {})),
                               held(lambda c, chunk: dict(chunk.named_parameters())),
                               loss=loss, step_ms=step_ms, peak_bytes=peak, master_weights=master,
                               actions_ms=actions_ms)
            if loss is not None and replica == 0:
                print(f"pipecheck progress: step {step + 1}/{config['steps']} loss {loss:.6g}", flush=True)
        if resume.get("save"):
            from megatron.core import dist_checkpointing
            os.makedirs(resume["save"], exist_ok=True)  # as Megatron-LM's save_checkpoint makes it first
            dist.barrier()
            dist_checkpointing.save(checkpoint_state(raw, optimizer, scheduler, config["steps"]), resume["save"])
        dist.barrier()
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
