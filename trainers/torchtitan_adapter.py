#!/usr/bin/env python3
"""TorchTitan as a trainer under test (`trainer=torchtitan`), speaking pipecheck's external-trainer
protocol (protocol.py, docs/protocol.md).

Each rank builds TorchTitan's own `Trainer` (torchtitan.trainer) around its llama3 model, sized to
the scenario, and calls `Trainer.train()` as `torchtitan.train` does. TorchTitan does everything a
step does, its way: it splits the model into pipeline stages (`pipeline_llm`, with config.json's
partition given as `module_fqns_per_model_part`), builds the schedule (`Schedule1F1B`,
`ScheduleZBVZeroBubble`, ... through `pipeline_parallel_schedule`, or a CSV through
`pipeline_parallel_schedule_csv`), computes the loss with its default `ChunkedLossWrapper` over
`CrossEntropyLoss` (summed, divided by the step's labelled tokens over every microbatch and
replica), accumulates, reduces data-parallel gradients, clips with `clip_grad_norm_` over the
pipeline mesh, and steps its `OptimizersContainer`. What pipecheck adds is only around it:

- the data: a data loader (TorchTitan's `BaseDataLoader`) that yields pipecheck's batches, one
  microbatch at a time, each sequence padded to seq_len with its labels ignored there;
- the weights: pipecheck's initial weights, converted by TorchTitan's own Hugging Face adapter
  (`Llama3StateDictAdapter.from_hf`: pipecheck's and Hugging Face's rotary are both rotate-half,
  TorchTitan's is complex over adjacent pairs, so wq and wk rows are permuted there), copied into
  the model parts after TorchTitan initialised them; gradients and weights go back through
  `to_hf`;
- the observation: an optimizer step pre-hook reads the gradients TorchTitan is about to apply
  (after accumulation, reduction and clipping), a post-hook the updated weights, and the loss is
  the one TorchTitan logs.

The scenario's columns map onto TorchTitan's configuration: schedule (gpipe GPipe, 1f1b 1F1B,
interleaved Interleaved1F1B, loopedbfs LoopedBFS, zbh1 InterleavedZeroBubble, zbv ZBVZeroBubble,
dualpipev DualPipeV, csv:PATH), microbatches (equal sizes only: TorchTitan takes a microbatch
size), clip (`training.max_norm`; off = infinity, which TorchTitan's clip multiplies by exactly 1),
data_parallel (`data_parallel_replicate_degree`), accumulation (`training.global_batch_size`),
recompute (1: TorchTitan's default selective activation checkpointing; 0: none), optimizer (SGD or
AdamW with the scenario's settings, constant learning rate), dtype (`training.dtype`: float32 or
bfloat16; TorchTitan has no float64).

CPU shims: TorchTitan assumes an accelerator in four places; `cpu_shims` (the one marked place,
applied only for device=cpu) makes each work on the CPU without changing what is computed.
"""
import dataclasses
import math
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: E402

from protocol import ActionClock, Exchange, Meter  # noqa: E402

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "loopedbfs": "LoopedBFS",
             "zbh1": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
# The scenario's `fault`, as the protocol hands it over: TorchTitan as it ships, the other loss path
# it ships, or a bug planted in the gradient path as a control.
FAULTS = {
    "none": "TorchTitan as it ships: its default loss, ChunkedLossWrapper over CrossEntropyLoss",
    "plain_loss": "not a bug: TorchTitan's CrossEntropyLoss without the ChunkedLossWrapper (its other loss path), "
                  "to tell the wrapper's defects from the schedule's",
    "norm_without_pp_reduction": "a control: clip_grad_norm_ called without the pipeline mesh, so each rank clips "
                                 "by its own stages' norm (the gradient-norm reduction over pipeline ranks skipped)",
    "last_save_model_only": "TorchTitan's default checkpoint.last_save_model_only=True at a resume: the final "
                            "step's checkpoint keeps the model alone, which the resumed run then asks every state of",
}
IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------
# CPU SHIMS: the one place this adapter changes TorchTitan, applied only for device=cpu. Each
# stands in for an accelerator call TorchTitan hard-codes; none changes what a step computes.
# ---------------------------------------------------------------------------------------------
def cpu_shims():
    """Must run before torchtitan is imported (shim 1 is read at import)."""
    import torch._utils

    # 1. Device type: with no accelerator `_get_available_device_type()` is None and TorchTitan
    #    falls back to "cuda" (tools/utils.py, get_device_info); no configuration overrides it.
    torch._utils._get_available_device_type = lambda: "cpu"

    # 2. Memory monitor (components/metrics.py, DeviceMemoryMonitor) asks the device module for
    #    functions torch.cpu does not have; they answer "nothing measured".
    def total_memory():
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    defaults = {"get_device_name": lambda *args: "cpu",
                "get_device_properties": lambda *args: types.SimpleNamespace(total_memory=total_memory(), name="cpu"),
                "reset_peak_memory_stats": lambda *args: None,
                "empty_cache": lambda *args: None,
                "memory_stats": lambda *args: {}}
    for name, function in defaults.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, function)

    import torchtitan.distributed.utils as dist_utils
    from torchtitan.models.common import attention

    # 3. set_pg_timeouts (distributed/utils.py) synchronises with barrier(device_ids=[...]), which
    #    Gloo refuses; the same barrier without device ids, then the same timeouts.
    def set_pg_timeouts(timeout, parallel_dims):
        dist.barrier()
        groups = [mesh.get_group() for mesh in parallel_dims.get_all_one_dimensional_meshes().values()] + [None]
        for group in groups:
            dist.distributed_c10d._set_pg_timeout(timeout, group)
    dist_utils.set_pg_timeouts = set_pg_timeouts

    # 4. Attention: FlexAttention (llama3's only backend for language models) has no backward on
    #    the CPU, eager or compiled. The same attention computed densely: the mask is the block
    #    mask's own mask_mod evaluated at every (query, key), softmax(q kᵀ · scale) v as the
    #    reference computes it.
    from torch.nn.attention.flex_attention import create_mask

    def dense_flex_attention(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
        if score_mod is not None:
            raise NotImplementedError("pipecheck's dense CPU attention takes no score_mod")
        batch, heads, length, head_dim = q.shape
        if enable_gqa and k.shape[1] != heads:
            k = k.repeat_interleave(heads // k.shape[1], dim=1)
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        # Built in every call, as FlexAttention builds its own: a mask kept between layers would
        # leave ops out of a layer that selective activation checkpointing recomputes (and it
        # refuses a recomputation that differs from the forward).
        keep = create_mask(block_mask.mask_mod, batch, 1, length, k.shape[2], device=q.device)
        scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(head_dim))
        scores = scores.masked_fill(~keep, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        lse = torch.logsumexp(scores, dim=-1) if return_aux is not None and return_aux.lse else None
        return out, types.SimpleNamespace(lse=lse)
    attention.FlexAttention.compiled_flex_attn = staticmethod(dense_flex_attention)
# ------------------------------------------------------------------------------- end of shims


def whole(tensor):
    """A copy of the whole tensor, whether TorchTitan holds it as a DTensor (on its meshes) or not."""
    tensor = tensor.detach()
    if not isinstance(tensor, DTensor):
        return tensor.clone()
    if tensor.device_mesh.size() == 1:  # a mesh of one rank holds the whole tensor locally
        return tensor._local_tensor.clone()
    return tensor.full_tensor()


def clean(name):
    """A parameter or module name as TorchTitan's checkpoints write it: activation checkpointing's
    wrapper module left out, as its state dict leaves it out."""
    return name.replace("._checkpoint_wrapped_module", "")


def hf_name(name):
    """pipecheck's global name -> the Hugging Face Llama name TorchTitan's adapter converts from."""
    fixed = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")  # layers.{i}.{module}.{leaf}[.weight]
    layer, rest = parts[1], ".".join(parts[2:])
    inner = {"attention.wq.weight": "self_attn.q_proj.weight", "attention.wk.weight": "self_attn.k_proj.weight",
             "attention.wv.weight": "self_attn.v_proj.weight", "attention.wo.weight": "self_attn.o_proj.weight",
             "feed_forward.w1.weight": "mlp.gate_proj.weight", "feed_forward.w3.weight": "mlp.up_proj.weight",
             "feed_forward.w2.weight": "mlp.down_proj.weight", "attention_norm.weight": "input_layernorm.weight",
             "ffn_norm.weight": "post_attention_layernorm.weight"}
    return f"model.layers.{layer}.{inner[rest]}"


class Names:
    """pipecheck's names <-> TorchTitan's, through TorchTitan's own Hugging Face state-dict adapter
    (which also permutes wq/wk rows between rotate-half and complex rotary)."""

    def __init__(self, adapter, pipecheck_names):
        self.adapter = adapter
        self.from_hf = {hf_name(name): name for name in pipecheck_names}

    def to_titan(self, tensors):
        return self.adapter.from_hf({hf_name(name): t for name, t in tensors.items()})

    def to_pipecheck(self, tensors):
        converted = self.adapter.to_hf(dict(tensors))
        return {self.from_hf[name]: t for name, t in converted.items()}


def model_spec(config):
    """TorchTitan's llama3 at the scenario's size: its own layer builder, rotary and norms."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import (Llama3Model, Llama3StateDictAdapter, parallelize_llama,
                                          _build_llama3_layers)
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.protocols.model_spec import ModelSpec
    model = config["model"]
    if model["flavor"] != "llama":
        raise SystemExit(f"torchtitan_adapter: TorchTitan's llama3 is a llama; flavor {model['flavor']!r} has no "
                         f"TorchTitan model here")
    hidden, heads, vocab = model["hidden"], model["heads"], model["vocab"]
    kv_heads = model.get("kv_heads", heads)
    normal = {"weight": lambda w: torch.nn.init.normal_(w, std=0.02)}
    ones = {"weight": torch.nn.init.ones_}
    layers = _build_llama3_layers(
        n_layers=model["layers"], dim=hidden, n_heads=heads, n_kv_heads=kv_heads, hidden_dim=model["ffn"],
        fuse_qkv=True, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=hidden // heads, max_seq_len=model["seq_len"], theta=10000.0, scaling="none"))
    spec = Llama3Model.Config(
        dim=hidden, vocab_size=vocab, enable_weight_tying=bool(model["tied"]),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=hidden, param_init=normal),
        norm=RMSNorm.Config(normalized_shape=hidden, eps=1e-5, param_init=ones),
        lm_head=Linear.Config(in_features=hidden, out_features=vocab, param_init=normal),
        layers=layers)
    for layer in spec.layers:
        layer.attention_norm.eps = 1e-5
        layer.ffn_norm.eps = 1e-5
    return ModelSpec(name="llama3", flavor="pipecheck", model=spec, parallelize_fn=parallelize_llama,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=None, state_dict_adapter=Llama3StateDictAdapter)


def module_fqns(config):
    """config.json's partition as TorchTitan's module_fqns_per_model_part, stage by stage."""
    parts = []
    for stage in config["stages"]:
        names = ["tok_embeddings"] if stage["embedding"] else []
        names += [f"layers.{i}" for i in range(*stage["layers"])]
        names += ["norm", "lm_head"] if stage["head"] else []
        parts.append(names)
    return parts


def make_data_loader_class(exchange, seq_len, steps, microbatch_size):
    """A TorchTitan data loader yielding pipecheck's batches: for each step, this replica's share of
    the batch (TorchTitan hands the loader its dp_rank and dp_world_size), microbatch by
    microbatch, each (input dict, labels) of microbatch_size sequences padded to seq_len. The
    Trainer draws a step's accumulation rounds x microbatches from it."""
    from torchtitan.components.dataloader import BaseDataLoader

    class PipecheckBatches(BaseDataLoader):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            pass

        def __init__(self, config, *, dp_rank=0, dp_world_size=1, **kwargs):
            self.config, self.replica, self.replicas = config, dp_rank, dp_world_size
            self.next_step = 0  # the data position, which TorchTitan's checkpoints keep (state_dict)

        def __iter__(self):
            for step in range(self.next_step, steps):
                self.next_step = step + 1  # once this step's microbatches are drawn, as a checkpoint sees it
                batch = exchange.batch(step)
                pad = seq_len - batch["tokens"].shape[1]
                tokens = torch.nn.functional.pad(batch["tokens"], (0, pad))
                labels = torch.nn.functional.pad(batch["labels"], (0, pad), value=IGNORE_INDEX)
                share = tokens.shape[0] // self.replicas  # each replica its contiguous share, as pipecheck splits
                first = self.replica * share
                positions = torch.arange(seq_len).expand(microbatch_size, seq_len).contiguous()
                for start in range(first, first + share, microbatch_size):
                    yield ({"input": tokens[start:start + microbatch_size], "positions": positions},
                           labels[start:start + microbatch_size])

        def state_dict(self):
            return {"next_step": self.next_step}

        def load_state_dict(self, state_dict):
            self.next_step = int(state_dict["next_step"])

    return PipecheckBatches


def make_tokenizer_class():
    """No text is tokenised: the batches come as tokens. A tokenizer config that builds nothing."""
    from torchtitan.components.tokenizer import BaseTokenizer

    class NoTokenizer(BaseTokenizer):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            pass

        def __init__(self, config=None, **kwargs):
            super().__init__()

        def encode(self, *args, **kwargs):
            raise NotImplementedError

        def decode(self, *args, **kwargs):
            raise NotImplementedError

        def get_vocab_size(self):
            return 0

    return NoTokenizer


def trainer_config(exchange, spec, folder):
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.trainer import Trainer

    config, scenario = exchange.config, exchange.config["scenario"]
    replicas = config.get("data_parallel", 1)
    sizes = config["microbatch_sizes"]  # every microbatch of the step: replicas x rounds x microbatches
    if len(set(sizes)) != 1:
        raise SystemExit(f"torchtitan_adapter: TorchTitan splits a batch into microbatches of one size "
                         f"(parallelism.pipeline_parallel_microbatch_size); this scenario's are {sizes}")
    microbatch_size = sizes[0]
    batch = sum(sizes)
    local_batch = microbatch_size * config["microbatches"]  # one replica's one round
    optimizer = config["optimizer"]  # adamw: TorchTitan's optimizers are Adam, AdamW and DistMuon
    group = ParamGroupConfig(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={
        "lr": optimizer["lr"], "betas": tuple(optimizer["betas"]), "eps": optimizer["eps"],
        "weight_decay": optimizer["weight_decay"]})
    schedule = config["schedule"]
    parallelism = ParallelismConfig(
        pipeline_parallel_degree=config["world_size"],
        pipeline_parallel_microbatch_size=microbatch_size,
        module_fqns_per_model_part=module_fqns(config),
        data_parallel_replicate_degree=replicas,
        data_parallel_shard_degree=1)
    if schedule.startswith("csv:"):
        parallelism.pipeline_parallel_schedule = "Interleaved1F1B" if config["virtual_stages"] > 1 else "1F1B"
        parallelism.pipeline_parallel_schedule_csv = config["schedule_csv"]
    else:
        parallelism.pipeline_parallel_schedule = SCHEDULES[schedule]
    recompute = scenario.get("recompute", "0") == "1"
    loss = CrossEntropyLoss.Config(global_vocab_size=config["model"]["vocab"])
    # A stretch of a resumed run (config.json's "resume"): TorchTitan's CheckpointManager saves the
    # whole training state (model, optimizers, lr schedulers, data loader, train state) after the
    # stretch's last step into "save" (step-N inside), and loads it from the previous stretch's
    # folder as a run with a new output path does (initial_load_path, every state, not the model
    # alone). last_save_model_only is turned off: its default keeps only the model in the final
    # step's checkpoint (for export), which a resume from it would silently train on without the
    # optimizer's state.
    from torchtitan.components.checkpointer import CheckpointManager
    resume = config.get("resume") or {}
    checkpoint = CheckpointManager.Config()
    if resume:
        checkpoint = CheckpointManager.Config(
            enable=True, folder=resume["save"] or "checkpoint", interval=10 ** 9, load_only=not resume["save"],
            last_save_model_only=exchange.fault == "last_save_model_only",
            initial_load_path=os.path.join(resume["load"], f"step-{resume['first_step']}") if resume["load"] else None,
            initial_load_model_only=False)
    clip = config["clip"]
    return Trainer.Config(
        model_spec=spec,
        dump_folder=folder,
        hf_assets_path=folder,
        tokenizer=make_tokenizer_class().Config(),
        dataloader=make_data_loader_class(exchange, config["model"]["seq_len"], config["steps"],
                                          microbatch_size).Config(),
        loss=loss if exchange.fault == "plain_loss" else ChunkedLossWrapper.Config(loss_fn=loss),
        optimizer=OptimizersContainer.Config(param_groups=[group]),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=0.0),
        training=TrainingConfig(local_batch_size=local_batch, global_batch_size=batch,
                                seq_len=config["model"]["seq_len"], steps=config["steps"],
                                max_norm=clip if clip > 0 else math.inf, dtype=config["dtype"],
                                mixed_precision_param=config["dtype"],
                                disable_cuda_graphs=True),
        parallelism=parallelism,
        metrics=MetricsProcessor.Config(log_freq=1),
        activation_checkpoint=SelectiveAC.Config() if recompute else None,
        checkpoint=checkpoint,
    )


def make_trainer_class(exchange, meter, clock, names, fault):
    """TorchTitan's Trainer, observed: each train_step is timed and metered (its schedule's actions
    by `clock`, where it is installed), and what its optimizer applies is handed back. Nothing of the step
    itself is overridden."""
    from torchtitan.trainer import Trainer
    import torchtitan.distributed.utils as dist_utils

    class ObservedTrainer(Trainer):
        def __init__(self, config):
            super().__init__(config)
            self.observed = {}
            self.named = {clean(name): p
                          for part in self.model_parts for name, p in part.named_parameters()}
            self.optimizers.register_step_pre_hook(lambda *args: self._grads())
            self.optimizers.register_step_post_hook(lambda *args: self._weights())
            log = self.metrics_processor.log

            def logged(step, global_avg_loss, *args, **kwargs):
                self.observed["loss"] = float(global_avg_loss)
                return log(step, global_avg_loss, *args, **kwargs)
            self.metrics_processor.log = logged

        def stock(self, tensors):
            """{TorchTitan parameter name: whole tensor} in its checkpoint layout: a fused wqkv split
            into wq, wk, wv by the module's own state-dict hook, as its checkpoints are written."""
            tensors = dict(tensors)
            for part in self.model_parts:
                for prefix, module in part.named_modules():
                    if hasattr(module, "_split_qkv_on_save"):
                        module._split_qkv_on_save(module, tensors, f"{clean(prefix)}.", None)
            return names.to_pipecheck(tensors)

        def load_pipecheck_weights(self, weights):
            """pipecheck's initial weights into the parts TorchTitan built and initialised, through
            its Hugging Face adapter and its fused-QKV load hook; returns what the parts then hold."""
            titan = names.to_titan(weights)
            for part in self.model_parts:
                for prefix, module in part.named_modules():
                    if hasattr(module, "_merge_qkv_on_load"):
                        module._merge_qkv_on_load(module, titan, f"{clean(prefix)}.")
            with torch.no_grad():
                for name, parameter in self.named.items():
                    if name not in titan:
                        raise SystemExit(f"torchtitan_adapter: TorchTitan's parameter {name} has no pipecheck weight")
                    value = titan[name].to(device=parameter.device, dtype=parameter.dtype)
                    if isinstance(parameter, DTensor):
                        value = distribute_tensor(value, parameter.device_mesh, parameter.placements)
                    parameter.copy_(value)
            return self.stock({name: whole(p) for name, p in self.named.items()})

        def _grads(self):
            self.observed["grads"] = self.stock(
                {name: whole(p.grad) for name, p in self.named.items() if p.grad is not None})

        def _weights(self):
            self.observed["weights"] = self.stock({name: whole(p) for name, p in self.named.items()})

        def train_step(self, data_iterator):
            step = self.step - 1  # Trainer.train counts steps from 1
            self.observed = {}
            dist.barrier()
            meter.start_step()
            clock.take()
            super().train_step(data_iterator)
            step_ms, peak = meter.end_step()
            loss = self.observed.get("loss") if self.pp_has_last_stage else None
            exchange.save_step(step, self.observed["grads"], self.observed["weights"], loss=loss, step_ms=step_ms,
                               peak_bytes=peak, actions_ms=clock.take())
            if loss is not None:
                print(f"pipecheck progress: step {step + 1}/{exchange.config['steps']} loss {loss:.6g}", flush=True)

    if fault == "norm_without_pp_reduction":
        clip = dist_utils.clip_grad_norm_

        def clip_without_pp(parameters, max_norm, *args, pp_mesh=None, **kwargs):
            return clip(parameters, max_norm, *args, pp_mesh=None, **kwargs)
        dist_utils.clip_grad_norm_ = clip_without_pp
    return ObservedTrainer


def place(exchange, trainer):
    """Which pipeline rank and replica TorchTitan made this process (its meshes decide), checked
    against config.json's placement; the process then writes into pipecheck's folder for that
    (replica, rank): rank{replica x world_size + rank}."""
    config, dims = exchange.config, trainer.parallel_dims
    pp_rank = dims.get_mesh("pp").get_local_rank() if dims.pp_enabled else 0
    replica = dims.get_mesh("batch").get_local_rank() if dims.dp_enabled else 0
    if dims.pp_enabled:
        held = sorted(stage.stage_index for stage in getattr(trainer.pp_schedule, "_stages",
                                                                [getattr(trainer.pp_schedule, "_stage", None)]))
        expected = sorted(stage["stage"] for stage in config["stages"] if stage["rank"] == pp_rank)
        if held != expected:
            raise SystemExit(f"torchtitan_adapter: TorchTitan placed stages {held} on pipeline rank {pp_rank}; "
                             f"pipecheck's placement for schedule {config['schedule']} is {expected}")
    exchange.write_as(replica * config["world_size"] + pp_rank)


def main():
    exchange = Exchange()
    config = exchange.config
    if exchange.refuses_fault(FAULTS, "torchtitan_adapter"):
        return 2
    device = exchange.device()
    if device.type == "cpu":
        cpu_shims()
    try:
        import torchtitan  # noqa: F401
    except ImportError as error:
        print(f"torchtitan_adapter: TorchTitan is not installed in {sys.executable} ({error}); "
              f"requirements.txt pins it; make deps installs it into .venv", file=sys.stderr)
        return 2
    meter = Meter(device)
    # TorchTitan steps torch.distributed.pipelining's schedules: their actions are timed there.
    clock = ActionClock()
    if device.type == "cpu":
        clock.install_pipelining()
    folder = os.path.join(exchange.outputs, "torchtitan")  # TorchTitan's dump_folder, shared by the ranks
    os.makedirs(folder, exist_ok=True)
    spec = model_spec(config)
    weights = exchange.weights()
    from torchtitan.models.llama3 import Llama3StateDictAdapter
    names = Names(Llama3StateDictAdapter(spec.model, None), weights.keys())
    trainer_class = make_trainer_class(exchange, meter, clock, names, exchange.fault)
    trainer = trainer_class(trainer_config(exchange, spec, folder))
    try:
        place(exchange, trainer)
        start = trainer.load_pipecheck_weights(weights)
        if (config.get("resume") or {}).get("load"):
            # What TorchTitan's train() loads first, loaded here once before it so that start.pt
            # holds the weights the resumed stretch starts from (train() then loads it again).
            trainer.checkpointer.load(step=-1)
            start = trainer.stock({name: whole(p) for name, p in trainer.named.items()})
        exchange.save_start(start)
        trainer.train()
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
