"""The external-trainer protocol, Python side (docs/protocol.md), and docs/design.md §2's model in
PyTorch modules, for trainers that want them.

pipecheck starts every rank of a trainer under test with the torchrun environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and:

  PIPECHECK_IN      folder pipecheck wrote: config.json, weights.pt, batch_K.pt for each step K
  PIPECHECK_OUT     folder the trainer writes: rank{R}/start.pt and rank{R}/step_K.pt
  PIPECHECK_FAULT   a bug the trainer is asked to inject ("none": none)
  PIPECHECK_THREADS intra-op threads per rank (0: the library's default)
  PIPECHECK_METER   pipecheck's tensor-memory meter as a shared library, for trainers that report
                    peak memory measured as pipecheck measures its own trainer (may be unset)

What a rank hands back, all by pipecheck's global parameter names:
  rank{R}/start.pt   {name: tensor}: the weights this rank holds before its first step
  rank{R}/step_K.pt  {"grads": {name: tensor}, the gradients the optimizer applied at step K
                                (after accumulation, tied-weight sums and clipping),
                      "weights": {name: tensor}, the weights after step K's update,
                      "loss": 0-dim tensor, step K's loss (only the rank that computes it),
                      "aux_loss": 0-dim tensor, the balance loss's part of "loss" (a mixture
                                of experts with aux_loss > 0; the rank that reports "loss"),
                      "step_ms": 0-dim tensor, this rank's step wall time (optional),
                      "peak_bytes": 0-dim tensor, tensor bytes held at most in the step (optional),
                      "actions_ms": {kind: 0-dim tensor}, the step's milliseconds in each kind of
                                work: "F" (forwards, their loss included), "B" (full backwards),
                                "I" and "W" (a split backward's halves), "COMM" (posting sends
                                and receives, waiting for sends), "WAIT" (waiting for a receive);
                                the rest of step_ms is the step's other work (optional),
                      "master_weights": {name: float32 tensor}, the float32 weights the optimizer
                                stepped, after step K: only a trainer that keeps them beside
                                bfloat16 parameters, every step (optional),
                      "boundaries": {"activation/S/M" or "gradient/S/M": tensor}, the hidden
                                state entering stage S for microbatch M, or the gradient of stage
                                S's output, cut to the microbatch's longest sequence (optional)}
Files are written whole (to a temporary name, then renamed), so pipecheck never reads half a file.
"""
import contextlib
import ctypes
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


class Exchange:
    """One rank's view of the exchange folders."""

    def __init__(self):
        self.inputs = os.environ["PIPECHECK_IN"]
        self.outputs = os.environ["PIPECHECK_OUT"]
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        self.fault = os.environ.get("PIPECHECK_FAULT", "none")
        with open(os.path.join(self.inputs, "config.json")) as f:
            self.config = json.load(f)
        self.folder = os.path.join(self.outputs, f"rank{self.rank}")
        os.makedirs(self.folder, exist_ok=True)
        threads = int(os.environ.get("PIPECHECK_THREADS", "0"))
        if threads > 0:
            torch.set_num_threads(threads)

    @property
    def dtype(self):
        return DTYPES[self.config["dtype"]]

    def device(self):
        if self.config["device"] == "cuda":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def weights(self):
        return torch.load(os.path.join(self.inputs, "weights.pt"), weights_only=False)  # pipecheck wrote them (LibTorch pickles)

    def batch(self, step):
        """{"tokens": (B, T) int64 padded to the batch's longest sequence, "labels": (B, T) int64
        (-100 on padding and on each sequence's last position), "lengths": (B) int64}."""
        return torch.load(os.path.join(self.inputs, f"batch_{step}.pt"), weights_only=False)  # pipecheck wrote them (LibTorch pickles)

    def refuses_fault(self, faults, trainer):
        """When the scenario's fault is not one of `faults` (name: what it does), says so on stderr,
        naming the known ones, and returns True: the trainer then exits 2."""
        if self.fault in faults:
            return False
        print(f"{trainer}: no fault {self.fault!r} here; this trainer knows: {', '.join(faults)}", file=sys.stderr)
        return True

    def write_as(self, process):
        """Hand back into process `process`'s folder, rank{process}: with replicas, a trainer whose
        own rank numbering differs writes as the (replica, rank) it plays, replica x world_size +
        rank (docs/protocol.md)."""
        self.rank = process
        self.folder = os.path.join(self.outputs, f"rank{process}")
        os.makedirs(self.folder, exist_ok=True)

    def stages_of_rank(self):
        return [stage for stage in self.config["stages"] if stage["rank"] == self.rank]

    def save(self, name, value):
        path = os.path.join(self.folder, name)
        torch.save(value, path + ".partial")
        os.replace(path + ".partial", path)

    def save_start(self, weights):
        self.save("start.pt", {name: t.detach().cpu().clone() for name, t in weights.items()})

    def save_step(self, step, grads, weights, loss=None, step_ms=None, peak_bytes=None, boundaries=None,
                  master_weights=None, aux_loss=None, expert_biases=None, expert_counts=None, actions_ms=None):
        record = {"grads": {name: g.detach().cpu().clone() for name, g in grads.items()},
                  "weights": {name: w.detach().cpu().clone() for name, w in weights.items()}}
        if expert_biases is not None:
            record["expert_biases"] = {name: b.detach().cpu().clone() for name, b in expert_biases.items()}
            record["expert_counts"] = {name: c.detach().cpu().clone() for name, c in (expert_counts or {}).items()}
        if master_weights is not None:
            record["master_weights"] = {name: w.detach().float().cpu().clone() for name, w in master_weights.items()}
        if boundaries:
            record["boundaries"] = boundaries
        if loss is not None:
            record["loss"] = torch.tensor(float(loss), dtype=torch.float64)
        if aux_loss is not None:
            record["aux_loss"] = torch.tensor(float(aux_loss), dtype=torch.float64)
        if step_ms is not None:
            record["step_ms"] = torch.tensor(float(step_ms), dtype=torch.float64)
        if peak_bytes is not None and peak_bytes >= 0:
            record["peak_bytes"] = torch.tensor(int(peak_bytes), dtype=torch.int64)
        if actions_ms:
            record["actions_ms"] = {kind: torch.tensor(float(ms), dtype=torch.float64) for kind, ms in actions_ms.items()}
        self.save(f"step_{step}.pt", record)


class Meter:
    """Peak tensor bytes of a step, measured as pipecheck measures its own trainer: on the CPU with
    pipecheck's counting hook (PIPECHECK_METER), on a GPU with the caching allocator's peak.
    Inactive (peak None) when neither is available."""

    def __init__(self, device):
        self.device, self.library = device, None
        path = os.environ.get("PIPECHECK_METER", "")
        if device.type == "cpu" and path:
            self.library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            self.library.pipecheck_meter_live_bytes.restype = ctypes.c_int64
            self.library.pipecheck_meter_peak_bytes.restype = ctypes.c_int64
            self.library.pipecheck_meter_start()
        self.base = 0

    def start_step(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.library is not None:
            self.library.pipecheck_meter_reset_peak()
        self.started = time.perf_counter()

    def end_step(self):
        """(step milliseconds, peak bytes or None)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.library is not None:
            peak = self.library.pipecheck_meter_peak_bytes()
        else:
            peak = None
        return (time.perf_counter() - self.started) * 1000.0, peak


class ActionClock:
    """Where a step's time goes by kind of work, measured around a framework's own functions as
    they run: "F" (a forward, its loss included), "B" (a whole backward), "I" and "W" (a split
    backward's halves), "COMM" (posting sends and receives, waiting for sends) and "WAIT" (waiting
    for a receive). The rest of a step (gradient sums, clipping, the optimizer, the schedule's own
    bookkeeping) is pipecheck's "other". Handed back per step as "actions_ms"; pipecheck's own
    trainer reports the same kinds off its timeline. Host clocks: installed on the CPU only, where a
    call returns when its work is done (on a GPU they would time kernel launches)."""

    def __init__(self):
        self.totals = {}
        self.depth = 0
        self.receives = set()  # id() of the works that carry a receive (PyTorch's pipelining)

    def add(self, kind, seconds):
        self.totals[kind] = self.totals.get(kind, 0.0) + seconds * 1000.0

    def timed(self, kind_of, function):
        """`function` timed as kind_of(args, kwargs) when not inside another timed call."""
        clock = self

        def wrapper(*args, **kwargs):
            if clock.depth:  # nested: the outer call is timed already
                return function(*args, **kwargs)
            clock.depth += 1
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                clock.depth -= 1
                clock.add(kind_of(args, kwargs), time.perf_counter() - started)
        return wrapper

    def take(self):
        """This step's milliseconds by kind, and a fresh count for the next: empty from a clock
        installed nowhere, which save_step then leaves out."""
        totals, self.totals = self.totals, {}
        self.receives.clear()
        return totals

    def install_pipelining(self):
        """Wraps torch.distributed.pipelining's stage and schedule functions (PyTorch's pipelining,
        and TorchTitan, which steps its schedules): a stage's forward_one_chunk and the schedule's
        loss are F, backward_one_chunk B (I when it is a split backward's first half),
        backward_weight_one_chunk W, _batch_p2p COMM, and each of its works' wait WAIT where the
        work carries a receive (a batch that both sends and receives, as 1F1B fuses them, counts
        as a receive), else COMM. Times nothing where this release lacks one of them, so that no
        step reports a partial account."""
        import inspect
        import torch.distributed as dist
        from torch.distributed.pipelining import schedules
        from torch.distributed.pipelining import stage as stage_module
        base = stage_module._PipelineStageBase
        schedule_base = getattr(schedules, "_PipelineSchedule", None)
        needed = [(base, "forward_one_chunk"), (base, "backward_one_chunk"), (base, "backward_weight_one_chunk"),
                  (schedule_base, "_maybe_compute_loss"), (schedules, "_batch_p2p"), (schedules, "_wait_batch_p2p")]
        if any(owner is None or not hasattr(owner, name) for owner, name in needed):
            return
        base.forward_one_chunk = self.timed(lambda a, k: "F", base.forward_one_chunk)
        parameters = inspect.signature(base.backward_one_chunk).parameters
        full = parameters.get("full_backward")
        position = list(parameters).index("full_backward") if full else None

        def backward_kind(args, kwargs):
            if full is None:
                return "B"
            value = kwargs.get("full_backward", args[position] if position < len(args) else full.default)
            return "B" if value else "I"
        base.backward_one_chunk = self.timed(backward_kind, base.backward_one_chunk)
        base.backward_weight_one_chunk = self.timed(lambda a, k: "W", base.backward_weight_one_chunk)
        schedule_base._maybe_compute_loss = self.timed(lambda a, k: "F", schedule_base._maybe_compute_loss)
        # _batch_p2p calls itself per process group: the outer call is the one timed.
        post, wait = self.timed(lambda a, k: "COMM", schedules._batch_p2p), schedules._wait_batch_p2p
        clock = self

        def batch_p2p(p2p_ops, *args, **kwargs):
            works = post(p2p_ops, *args, **kwargs)
            if any(op.op == dist.irecv for op in p2p_ops):
                clock.receives.update(id(work) for work in works)
            return works

        def wait_batch_p2p(works, *args, **kwargs):
            if clock.depth:
                return wait(works, *args, **kwargs)
            for work in list(works):
                started = time.perf_counter()
                wait([work], *args, **kwargs)
                clock.add("WAIT" if id(work) in clock.receives else "COMM", time.perf_counter() - started)
                clock.receives.discard(id(work))
        schedules._batch_p2p, schedules._wait_batch_p2p = batch_p2p, wait_batch_p2p


def runs_a_microbatch(x):
    """Whether a stage's forward on input `x` trains a microbatch, rather than pipelining's shape
    inference (run on meta tensors, or on zeros under no_grad), for releases whose stages do not
    say which forward they run."""
    return x.device.type != "meta" and torch.is_grad_enabled()


class Microbatches:
    """Which microbatch each stage module's forward runs, for schedules that hand a stage only its
    hidden states. Each forward gets its microbatch's sequence lengths (module.key_lengths, so
    padded keys are masked as docs/design.md §2 says); `transforms` may replace its input
    (f(stage, microbatch, x) -> tensor or None), and `listeners` then hear (stage, microbatch, input).

    How the microbatch is known, by release: where a PipelineStage offers
    register_forward_context (PyTorch 2.15 on), pipelining itself names the stage and microbatch of
    every forward it runs, and whether it is its metadata-inference probe, which trains nothing; a
    forward outside such a context trains nothing either. Older releases name nothing: there a
    stage's forwards are counted, since every schedule they ship runs a stage's forwards in
    microbatch order and their shape inference runs on meta tensors or without grad."""

    def __init__(self, modules, stages, microbatch_sizes, pipeline_stages=()):
        self.sizes, self.listeners, self.transforms, self.lengths, self.count = microbatch_sizes, [], [], [], {}
        self.running = {}  # stage -> the PipelineStageInfo of the forward in progress (PyTorch 2.15 on)
        self.told = bool(pipeline_stages) and all(hasattr(s, "register_forward_context") for s in pipeline_stages)
        if self.told:
            for pipeline_stage, stage in zip(pipeline_stages, stages):
                pipeline_stage.register_forward_context(self._context(stage["stage"]))
        for module, stage in zip(modules, stages):
            module.register_forward_pre_hook(self._pre_hook(stage["stage"]))

    def begin_step(self, lengths):
        """`lengths`: the step's sequence lengths (the batch's "lengths")."""
        self.count, self.lengths, first = {}, [], 0
        for size in self.sizes:
            self.lengths.append(lengths[first:first + size])
            first += size

    def _context(self, stage):
        @contextlib.contextmanager
        def context(info):
            self.running[stage] = info
            try:
                yield
            finally:
                self.running.pop(stage, None)
        return context

    def _microbatch(self, stage, x):
        """The microbatch this forward of `stage` trains, or None for one that trains none."""
        if self.told:
            info = self.running.get(stage)
            if info is None or info.is_metadata_inference:
                return None
            microbatch = info.microbatch_index
        else:
            if not runs_a_microbatch(x):
                return None
            microbatch = self.count.get(stage, 0)
            self.count[stage] = microbatch + 1
        if not 0 <= microbatch < len(self.lengths):
            raise RuntimeError(f"stage {stage} runs microbatch {microbatch}, but a step has {len(self.lengths)} "
                               f"microbatches{'' if self.told else ' (counted: a forward this trainer took for one)'}")
        return microbatch

    def _pre_hook(self, stage):
        def hook(module, args):
            x = args[0]
            microbatch = self._microbatch(stage, x)
            if microbatch is None:
                module.key_lengths = None
                return None
            module.key_lengths = self.lengths[microbatch].to(x.device)
            for transform in self.transforms:
                replaced = transform(stage, microbatch, x)
                if replaced is not None:
                    x = replaced
            for listener in self.listeners:
                listener(stage, microbatch, x)
            return (x,) + tuple(args[1:]) if x is not args[0] else None
        return hook


class BoundaryTaps:
    """The tensors crossing stage boundaries, for pipecheck's first-divergence judge: each
    non-first stage's input as it arrives ("activation/S/M") and the gradient it sends back for it
    ("gradient/S-1/M", hooked on that input), cut to the microbatch's longest sequence.

    The copies are made, kept and freed on a helper thread: pipecheck's meter counts the training
    thread's tensors only, so the trainer's measured peak stays its own."""

    def __init__(self, microbatches):
        import concurrent.futures
        self.helper = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.microbatches, self.records, self.handles = microbatches, {}, []
        microbatches.listeners.append(self._arrived)

    def begin_step(self):
        self.helper.submit(self.records.clear).result()

    def end_step(self):
        """The step's boundary tensors (dropped by the next begin_step, on the helper thread)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return self.records

    def _keep(self, key, tensor, time):
        self.helper.submit(lambda: self.records.__setitem__(key, tensor.detach()[:, :time].clone())).result()

    def _arrived(self, stage, microbatch, x):
        if stage == 0:
            return
        time = int(self.microbatches.lengths[microbatch].max())
        self._keep(f"activation/{stage}/{microbatch}", x, time)
        if x.requires_grad:
            self.handles.append(x.register_hook(lambda grad: self._keep(f"gradient/{stage - 1}/{microbatch}", grad, time)))


def ffn_size(model):
    if model["ffn"] > 0:
        return model["ffn"]
    if model["flavor"] == "gpt2":
        return 4 * model["hidden"]
    return ((8 * model["hidden"] + 2) // 3 + 3) // 4 * 4


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
    """Multi-head attention; with kv_heads < heads, grouped-query: query head h attends with
    key/value head h // (heads // kv_heads)."""

    def __init__(self, flavor, hidden, heads, kv_heads=None):
        super().__init__()
        bias = flavor == "gpt2"
        self.flavor, self.heads, self.kv_heads = flavor, heads, kv_heads or heads
        kv_width = self.kv_heads * (hidden // heads)
        self.wq = nn.Linear(hidden, hidden, bias=bias)
        self.wk = nn.Linear(hidden, kv_width, bias=bias)
        self.wv = nn.Linear(hidden, kv_width, bias=bias)
        self.wo = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x, keep):
        """Causal attention over the keys `keep` (b or 1, 1, t, t) allows."""
        b, t, c = x.shape
        hd = c // self.heads
        q = self.wq(x).view(b, t, self.heads, hd).transpose(1, 2)
        k, v = (w(x).view(b, t, self.kv_heads, hd).transpose(1, 2) for w in (self.wk, self.wv))
        if self.flavor == "llama":
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd))
            angles = torch.outer(torch.arange(t, dtype=torch.float64, device=x.device), inv_freq)
            table = torch.cat([angles, angles], -1)
            cos, sin = table.cos().to(x.dtype), table.sin().to(x.dtype)
            half = hd // 2

            def rotate(u):
                return u * cos + torch.cat([-u[..., half:], u[..., :half]], -1) * sin

            q, k = rotate(q), rotate(k)
        if self.kv_heads != self.heads:
            k, v = (u.repeat_interleave(self.heads // self.kv_heads, dim=1) for u in (k, v))
        scores = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).masked_fill(~keep, float("-inf"))
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


class ResidualWithBalanceLoss(torch.autograd.Function):
    """The MoE layer's residual add h + routed that also carries the layer's balance-loss term
    `aux` (0-dim): in the backward, `aux` gets gradient 1 beside the sum's own. A pipeline schedule
    backpropagates from each stage's output only (the last stage's from its loss), so a term made
    inside a stage must enter that stage's backward through its output like this (the pattern of
    Megatron-Core's MoEAuxLossAutoScaler). The sum is a new tensor, so a stage ending in an MoE
    layer hands pipelining an output that is no view (see IdentityWithBalanceLoss)."""

    @staticmethod
    def forward(ctx, h, routed, aux):
        ctx.save_for_backward(aux)
        return h + routed

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, grad, torch.ones_like(aux)


class IdentityWithBalanceLoss(torch.autograd.Function):
    """Megatron-Core's MoEAuxLossAutoScaler form: hands its input `x` on as it is and gives `aux`
    gradient 1 in the backward. Autograd makes an input handed back a view of it, so a stage ending
    in such a layer outputs a view (torch_pipelining.py's fault=identity_attach)."""

    @staticmethod
    def forward(ctx, x, aux):
        ctx.save_for_backward(aux)
        return x

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux)


class MoeFeedForward(nn.Module):
    """docs/design.md §2's mixture of experts: a router (float32, float64 for float64 models)
    scores `experts` llama MLPs by a softmax or a sigmoid; each token takes the top_k by score
    (ties to the lower index), weighted by the chosen scores renormalised; dropless. Returns the
    output and the sequence-wise balance-loss term (None when its weight is 0).

    The dispatch is the grouped one production MoE layers use: the (token, choice) slots sorted by
    expert, one run of each expert over its slots, the results added back at their tokens. An
    expert no slot chose runs nothing and gets no gradient."""

    def __init__(self, hidden, moe):
        super().__init__()
        self.count, self.top_k, self.softmax = moe["experts"], moe["top_k"], moe["router"] == "softmax"
        self.weight = moe["aux_loss"] / moe["sequences_per_step"]
        self.router = nn.Linear(hidden, self.count, bias=False)
        self.experts = nn.ModuleList(FeedForward("llama", hidden, moe["expert_ffn"]) for _ in range(self.count))
        if moe["shared_experts"]:
            self.shared = FeedForward("llama", hidden, moe["expert_ffn"])
        if moe.get("expert_bias", 0) > 0:
            # Auxiliary-loss-free balancing, as TorchTitan's MoE holds it: the bias (for the choice
            # alone) is state, the counts since the last update are scratch. Its trainer moves the
            # bias after the step (move_expert_biases) and keeps it in the router's dtype.
            self.register_buffer("expert_bias", torch.zeros(self.count), persistent=True)
            self.register_buffer("tokens_per_expert", torch.zeros(self.count), persistent=False)

    def forward(self, x, lengths):
        b, t, c = x.shape
        flat = x.reshape(b * t, c)
        router_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        logits = F.linear(flat.to(router_dtype), self.router.weight.to(router_dtype))
        scores = torch.softmax(logits, -1) if self.softmax else torch.sigmoid(logits)
        choice = scores.detach() + self.expert_bias if hasattr(self, "expert_bias") else scores.detach()
        chosen = choice.sort(dim=-1, descending=True, stable=True).indices[:, :self.top_k]  # (N, k)
        top = scores.gather(1, chosen)
        gates = (top / top.sum(-1, keepdim=True)).to(x.dtype).reshape(-1)
        valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]  # (b, t)
        # Padding positions are routed but not dispatched (design §2): their slots go to index E,
        # past every expert, so an expert chosen only by padding runs nothing.
        slots = chosen.masked_fill(~valid.reshape(-1, 1), self.count).reshape(-1)
        order = torch.argsort(slots, stable=True)  # slots grouped by expert, each group in token order
        tokens, slot_gates = order // self.top_k, gates[order]
        counts = torch.bincount(slots, minlength=self.count + 1)
        if hasattr(self, "tokens_per_expert"):
            with torch.no_grad():  # every forward counts (TorchTitan's accumulation), padding excluded
                self.tokens_per_expert.add_(counts[:self.count].to(self.tokens_per_expert.dtype))
        out, first = torch.zeros_like(flat), 0
        for expert, size in zip(self.experts, counts.tolist()):
            if size:
                mine = tokens[first:first + size]
                out = out.index_add(0, mine, expert(flat[mine]) * slot_gates[first:first + size, None])
            first += size
        if hasattr(self, "shared"):
            out = out + self.shared(flat)
        aux = None
        if self.weight > 0:
            valid = valid.reshape(-1, 1).to(router_dtype)
            picked = torch.zeros_like(scores, requires_grad=False).scatter_(1, chosen, 1.0) * valid
            length = lengths.to(router_dtype)[:, None]
            fraction = picked.view(b, t, -1).sum(1) * (self.count / self.top_k) / length  # (b, E), a constant
            probs = scores if self.softmax else scores / scores.sum(-1, keepdim=True)
            mean = (probs * valid).view(b, t, -1).sum(1) / length
            aux = (fraction * mean).sum() * self.weight
        return out.view(b, t, c), aux


def recomputing():
    """Whether this forward runs inside a backward: activation checkpointing recomputing a block,
    whose balance-loss term was already logged by the forward itself."""
    return torch._C._current_graph_task_id() != -1


class Block(nn.Module):
    def __init__(self, flavor, hidden, heads, ffn, kv_heads=None, moe=None):
        super().__init__()
        self.attention_norm = Norm(flavor, hidden)
        self.attention = Attention(flavor, hidden, heads, kv_heads)
        self.ffn_norm = Norm(flavor, hidden)
        self.feed_forward = MoeFeedForward(hidden, moe) if moe else FeedForward(flavor, hidden, ffn)

    def forward(self, x, keep, lengths=None, balance=None):
        """`lengths`: the sequences' lengths (a mixture of experts' balance statistics count only
        their positions); `balance`: a list that hears each balance-loss term, detached, or None."""
        h = x + self.attention(self.attention_norm(x), keep)
        if not isinstance(self.feed_forward, MoeFeedForward):
            return h + self.feed_forward(self.ffn_norm(h))
        routed, aux = self.feed_forward(self.ffn_norm(h), lengths)
        if aux is None:
            return h + routed
        if balance is not None and not recomputing():
            balance.append(aux.detach())
        if self.attach_balance == "residual":
            return ResidualWithBalanceLoss.apply(h, routed, aux)
        if self.attach_balance == "identity":
            return IdentityWithBalanceLoss.apply(h + routed, aux)
        return h + routed

    # How the balance-loss term enters the backward: "residual" (ResidualWithBalanceLoss),
    # "identity" (IdentityWithBalanceLoss), or None (it does not: a trainer's fault).
    attach_balance = "residual"


class StageModule(nn.Module):
    """One stage of config.json's "stages": its layers under their global names, the embedding on
    the first stage, the final norm and head on the last (the head is tok_embeddings.weight when
    tied). The whole model is the one stage of a single-stage config."""

    def __init__(self, model, stage):
        super().__init__()
        flavor, hidden = model["flavor"], model["hidden"]
        self.flavor, self.has_embedding, self.has_head = flavor, stage["embedding"], stage["head"]
        if self.has_embedding or (self.has_head and model["tied"]):
            self.tok_embeddings = nn.Embedding(model["vocab"], hidden)
        if self.has_embedding and flavor == "gpt2":
            self.pos_embeddings = nn.Embedding(model["seq_len"], hidden)
        first, end = stage["layers"]
        moe = model.get("moe")
        self.layers = nn.ModuleDict({str(i): Block(flavor, hidden, model["heads"], ffn_size(model),
                                                   model.get("kv_heads"),
                                                   moe if moe and i >= moe["dense_layers"] else None)
                                     for i in range(first, end)})
        self.balance_terms = []  # each training forward's balance-loss terms, detached
        if self.has_head:
            self.norm = Norm(flavor, hidden)
            if not model["tied"]:
                self.output = nn.Linear(hidden, model["vocab"], bias=False)

    # The sequence lengths of the microbatch in the next forward: keys past a sequence's length
    # are masked (design §2). None: causal only, which changes no loss or gradient (padding sits
    # at the end, so no real position attends to it) but does change padded positions' hidden
    # states, which the first-divergence judge compares.
    key_lengths = None
    # Activation checkpointing (recompute=1): each block's forward runs again in the backward
    # (torch.utils.checkpoint, non-reentrant), as TorchTitan's full AC wraps each block.
    recompute = False

    def forward(self, x):
        t = x.shape[1]
        positions = torch.arange(t, device=x.device)
        keep = (positions[:, None] >= positions[None, :])[None, None]
        if self.key_lengths is not None:
            keep = keep & (positions[None, None, None, :] < self.key_lengths[:, None, None, None])
        if self.has_embedding:
            x = self.tok_embeddings(x)
            if self.flavor == "gpt2":
                x = x + self.pos_embeddings(torch.arange(x.shape[1], device=x.device))
        lengths = self.key_lengths if self.key_lengths is not None else torch.full((x.shape[0],), t, device=x.device)
        # Only a forward that trains a microbatch (key_lengths set) reports its balance terms.
        balance = self.balance_terms if self.key_lengths is not None else None
        for block in self.layers.values():
            if self.recompute and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, keep, lengths, balance, use_reentrant=False)
            else:
                x = block(x, keep, lengths, balance)
        if self.has_head:
            head = self.output.weight if hasattr(self, "output") else self.tok_embeddings.weight
            x = F.linear(self.norm(x), head)
        return x


def token_loss(logits, labels, total_tokens):
    """docs/design.md §2's loss for the tokens in `labels`: the summed cross entropy divided by the
    labelled tokens of the whole batch (so microbatch losses add up to the batch's)."""
    as_loss = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(as_loss.reshape(-1, as_loss.shape[-1]), labels.reshape(-1), ignore_index=-100,
                           reduction="sum") / total_tokens


def make_optimizer(config, parameters):
    """The reference's optimizer: plain SGD, or AdamW with config.json's hyper-parameters."""
    optimizer = config["optimizer"]
    if optimizer["name"] == "sgd":
        return torch.optim.SGD(parameters, lr=optimizer["lr"])
    return torch.optim.AdamW(parameters, lr=optimizer["lr"], betas=tuple(optimizer["betas"]), eps=optimizer["eps"],
                             weight_decay=optimizer["weight_decay"])


def clip_factor(total_norm, max_norm):
    """PyTorch's clip_grad_norm_ rule, as the reference applies it; 1 when clipping is off."""
    if max_norm <= 0:
        return 1.0
    factor = max_norm / (total_norm + 1e-6)
    return factor if factor < 1.0 else 1.0
