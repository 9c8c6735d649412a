#!/usr/bin/env python3
"""A worked external trainer: pipecheck's protocol (docs/protocol.md) spoken by hand, around a
plain single-process PyTorch trainer. Put your own trainer under test the same way: read what
pipecheck wrote into $PIPECHECK_IN, train, write what it asks for into $PIPECHECK_OUT/rank{RANK}.

    name,trainer,world_size,steps
    mine,external:examples/plain_trainer.py,1,3

The model is docs/design.md §2's, borrowed from trainers/protocol.py; a real trainer brings its own
and maps its parameter names onto pipecheck's (NAMES below shows where). Set the scenario's `fault`
column to one of FAULTS to see what pipecheck says when a trainer gets something wrong.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainers"))
from protocol import StageModule, clip_factor, make_optimizer, token_loss  # noqa: E402

FAULTS = {
    "none": "trains correctly",
    "grad_bug": "at step 1 applies (and hands back) 1.5 x the gradient of layers.0.feed_forward.w2.weight",
    "missing_step": "never writes the last step's file",
    "wrong_shape": "hands back layers.0.attention.wq.weight's gradient with its last column cut off",
    "nan": "hands back a NaN in norm.weight's gradient at step 0",
    "bad_name": "hands back its own name for a parameter (model.norm.weight)",
    "no_loss": "leaves the loss out of its step files",
    "crash": "dies at step 1",
    "hang": "stops answering at step 1",
    "stale_copy": "bfloat16: at step 1 leaves norm.weight's bfloat16 copy of its float32 master weight unrefreshed",
    "master_lr_bug": "bfloat16: at step 1 steps norm.weight's float32 master weight at twice the learning rate",
}

# Your trainer's parameter names -> pipecheck's global names (identity here: same model).
NAMES = {}


def save(folder, name, value):
    """Whole files only: write aside, then rename."""
    torch.save(value, os.path.join(folder, name + ".partial"))
    os.replace(os.path.join(folder, name + ".partial"), os.path.join(folder, name))


def main():
    inputs, outputs = os.environ["PIPECHECK_IN"], os.environ["PIPECHECK_OUT"]
    rank, fault = int(os.environ.get("RANK", "0")), os.environ.get("PIPECHECK_FAULT", "none")
    if fault not in FAULTS:
        sys.exit(f"plain_trainer: unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    with open(os.path.join(inputs, "config.json")) as f:
        config = json.load(f)
    if config["world_size"] != 1:
        sys.exit("plain_trainer: a single-process trainer; the scenario needs world_size 1")
    dtype = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}[config["dtype"]]
    folder = os.path.join(outputs, f"rank{rank}")
    os.makedirs(folder, exist_ok=True)

    # The whole model is one stage: embedding, every layer, head.
    whole = {"stage": 0, "rank": 0, "layers": [0, config["model"]["layers"]], "embedding": True, "head": True}
    model = StageModule(config["model"], whole).to(dtype)
    weights = torch.load(os.path.join(inputs, "weights.pt"), weights_only=False)
    model.load_state_dict({name: weights[NAMES.get(name, name)] for name in model.state_dict()})
    named = {NAMES.get(name, name): p for name, p in model.named_parameters()}
    save(folder, "start.pt", {name: p.detach().clone() for name, p in named.items()})
    # In bfloat16 the optimizer steps float32 master copies of the weights, as production trainers'
    # mixed-precision optimizers do, and hands them back as "master_weights" every step.
    master = {name: p.detach().float().clone().requires_grad_(True) for name, p in named.items()} \
        if dtype == torch.bfloat16 else None
    optimizer = make_optimizer(config, list((master or named).values()))

    for step in range(config["steps"]):
        if step == 1 and fault == "crash":
            raise RuntimeError("plain_trainer: the crash this fault asks for")
        if step == 1 and fault == "hang":
            time.sleep(3600)
        started = time.perf_counter()
        batch = torch.load(os.path.join(inputs, f"batch_{step}.pt"), weights_only=False)
        total = int((batch["labels"] != -100).sum())
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)  # with master weights the optimizer holds other tensors
        loss = torch.zeros((), dtype=torch.float64)
        first = 0
        for size in config["microbatch_sizes"]:  # accumulate over the scenario's microbatches
            tokens, labels = batch["tokens"][first:first + size], batch["labels"][first:first + size]
            model.key_lengths = batch["lengths"][first:first + size]  # padded keys are masked
            first += size
            part = token_loss(model(tokens), labels, total)
            part.backward()
            loss += part.detach().double()
        if step == 1 and fault == "grad_bug":
            named["layers.0.feed_forward.w2.weight"].grad.mul_(1.5)
        norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in named.values()))
        factor = clip_factor(float(norm), config["clip"])
        for p in named.values():
            p.grad.mul_(factor)
        if master is None:
            optimizer.step()
        else:
            for name, p in named.items():
                master[name].grad = p.grad.float()
            before = master["norm.weight"].detach().clone()
            optimizer.step()
            if step == 1 and fault == "master_lr_bug":
                with torch.no_grad():
                    master["norm.weight"].add_(master["norm.weight"] - before)
            with torch.no_grad():
                for name, p in named.items():
                    if not (step == 1 and fault == "stale_copy" and name == "norm.weight"):
                        p.copy_(master[name])
        step_ms = (time.perf_counter() - started) * 1000.0

        grads = {name: p.grad.detach().clone() for name, p in named.items()}
        if fault == "wrong_shape":
            grads["layers.0.attention.wq.weight"] = grads["layers.0.attention.wq.weight"][:, :-1]
        if fault == "nan" and step == 0:
            grads["norm.weight"][0] = float("nan")
        if fault == "bad_name":
            grads["model.norm.weight"] = grads.pop("norm.weight")
        if master is not None:
            grads = {name: m.grad.detach().clone() for name, m in master.items()}
        record = {"grads": grads, "weights": {name: p.detach().clone() for name, p in named.items()},
                  "loss": loss, "step_ms": torch.tensor(step_ms, dtype=torch.float64)}
        if master is not None:
            record["master_weights"] = {name: m.detach().clone() for name, m in master.items()}
        if fault == "no_loss":
            del record["loss"]
        if fault == "missing_step" and step == config["steps"] - 1:
            break
        save(folder, f"step_{step}.pt", record)
        print(f"pipecheck progress: step {step + 1}/{config['steps']} loss {float(loss):.6g}", flush=True)


if __name__ == "__main__":
    main()
