#!/usr/bin/env python3
"""Cross-check `pipecheck dump` with a second implementation of DESIGN.md §2.

The model here is rebuilt from the design text with Python's torch (Debian's python3-torch),
sharing no code with pipecheck: it loads weights.pt and batch.pt, computes the loss and every
gradient with autograd, and requires loss within 1e-10 and each gradient within 1e-10
relative of what pipecheck wrote (relative to max(its norm, 1e-6 x the global gradient norm)). Exits 77 (CTest's skip) when torch cannot be imported.
"""
import argparse
import csv
import math
import os
import subprocess
import sys

SKIP = 77

try:
    import torch
    import torch.nn.functional as F
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: python3-torch is not available ({error})")
    sys.exit(SKIP)

TOLERANCE = 1e-10
GRADIENT_FLOOR = 1e-6


def ffn_size(row):
    return int(row["ffn"])


def rms_norm(x, weight):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


def rotary(x, positions):
    # Hugging Face Llama: inv_freq over even dims, rotate_half convention.
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(positions.to(torch.float64), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = head_dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def linear(x, w, params, bias_name):
    b = params.get(bias_name)
    return F.linear(x, w, b)


def forward(params, row, tokens, lengths):
    flavor = row["flavor"]
    heads = int(row["heads"])
    layers = int(row["layers"])
    tied = row["tied"] == "1"
    B, T = tokens.shape
    x = F.embedding(tokens, params["tok_embeddings.weight"])
    if flavor == "gpt2":
        x = x + params["pos_embeddings.weight"][:T]
    hidden = x.shape[-1]
    hd = hidden // heads
    pos = torch.arange(T)
    allowed = (pos[None, :, None] >= pos[None, None, :]) & (pos[None, None, :] < lengths[:, None, None])
    mask = allowed[:, None, :, :]

    def norm(h, prefix):
        if flavor == "llama":
            return rms_norm(h, params[prefix + ".weight"])
        return layer_norm(h, params[prefix + ".weight"], params[prefix + ".bias"])

    for i in range(layers):
        p = f"layers.{i}."
        h = norm(x, p + "attention_norm")
        q, k, v = (linear(h, params[p + f"attention.{n}.weight"], params, p + f"attention.{n}.bias")
                   for n in ("wq", "wk", "wv"))
        q, k, v = (t.view(B, T, heads, hd).transpose(1, 2) for t in (q, k, v))
        if flavor == "llama":
            q, k = rotary(q, pos), rotary(k, pos)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        attn = attn.transpose(1, 2).reshape(B, T, hidden)
        x = x + linear(attn, params[p + "attention.wo.weight"], params, p + "attention.wo.bias")
        h = norm(x, p + "ffn_norm")
        if flavor == "llama":
            up = F.silu(F.linear(h, params[p + "feed_forward.w1.weight"])) * F.linear(h, params[p + "feed_forward.w3.weight"])
            x = x + F.linear(up, params[p + "feed_forward.w2.weight"])
        else:
            up = F.gelu(linear(h, params[p + "feed_forward.w1.weight"], params, p + "feed_forward.w1.bias"), approximate="tanh")
            x = x + linear(up, params[p + "feed_forward.w2.weight"], params, p + "feed_forward.w2.bias")
    x = norm(x, "norm")
    head = params["tok_embeddings.weight"] if tied else params["output.weight"]
    return F.linear(x, head)


def check_dump(directory):
    with open(os.path.join(directory, "scenario.csv"), newline="") as f:
        row = next(csv.DictReader(f))
    weights = torch.load(os.path.join(directory, "weights.pt"))
    batch = torch.load(os.path.join(directory, "batch.pt"))
    grads = torch.load(os.path.join(directory, "grads.pt"))
    expected_loss = torch.load(os.path.join(directory, "loss.pt"))["loss"]

    expected_names = {"tok_embeddings.weight", "norm.weight"}
    if row["tied"] != "1":
        expected_names.add("output.weight")
    missing = expected_names - set(weights)
    if missing or (row["tied"] == "1" and "output.weight" in weights):
        return [f"unexpected parameter names: missing {sorted(missing)}, have {sorted(weights)[:5]}..."]

    params = {name: tensor.clone().requires_grad_(True) for name, tensor in weights.items()}
    tokens, labels, lengths = batch["tokens"], batch["labels"], batch["lengths"]
    logits = forward(params, row, tokens, lengths)
    valid = (labels != -100).sum()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100, reduction="sum") / valid
    loss.backward()

    problems = []
    loss_diff = abs(loss.item() - expected_loss.item())
    if loss_diff > TOLERANCE:
        problems.append(f"loss {expected_loss.item():.15g} vs python {loss.item():.15g} (diff {loss_diff:.3g})")
    if set(grads) != set(params):
        problems.append(f"gradient names differ: {sorted(set(grads) ^ set(params))}")
    # A gradient that is zero analytically (a key projection's bias: softmax ignores a constant
    # per row) holds rounding noise of ~1e-20; it is judged against a floor of GRADIENT_FLOOR
    # times the whole model's gradient norm instead of against its own noise.
    global_norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in params.values()))
    worst = (0.0, "")
    for name, param in params.items():
        if name not in grads:
            continue
        reference = param.grad
        denom = max(reference.norm().item(), GRADIENT_FLOOR * global_norm)
        rel = (grads[name] - reference).norm().item() / denom
        if rel > worst[0]:
            worst = (rel, name)
        if rel > TOLERANCE:
            problems.append(f"gradient {name}: relative error {rel:.3g}")
    print(f"  loss {loss.item():.12f} (diff {loss_diff:.2e}), worst gradient rel err {worst[0]:.2e} {worst[1]}, "
          f"{len(params)} parameters, {int(valid)} tokens")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipecheck", required=True, help="path to the pipecheck binary")
    parser.add_argument("--scenarios", required=True, help="scenario CSV; every row is dumped and checked")
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)

    with open(args.scenarios, newline="") as f:
        names = [r["name"] for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    failures = 0
    for name in names:
        out = os.path.join(args.workdir, name)
        subprocess.run([args.pipecheck, "dump", "--scenarios", args.scenarios, "--scenario", name, "--out", out],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"{name}:")
        problems = check_dump(out)
        for problem in problems:
            print(f"  FAIL {problem}")
        failures += bool(problems)
    print(f"{len(names) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
