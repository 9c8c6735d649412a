#!/usr/bin/env python3
"""Cross-check `pipecheck dump` with a second implementation of docs/design.md §2.

The model here (grouped-query attention and the mixture of experts with its balance loss included)
is rebuilt from the design text with Python's torch (the PyTorch pipecheck is
built against), sharing no code with pipecheck: it loads weights.pt and batch.pt, computes the loss and every
gradient with autograd, and requires loss within 1e-10 and each gradient within 1e-10
relative of what pipecheck wrote (relative to max(its norm, 1e-6 x the global gradient norm)).
"""
import argparse
import csv
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

TOLERANCE = 1e-10
GRADIENT_FLOOR = 1e-6


def ffn_size(row):
    """docs/design.md §2: 4 x hidden for gpt2; 8 x hidden / 3 rounded up to a multiple of 4 for llama."""
    if row.get("ffn"):
        return int(row["ffn"])
    hidden = int(row["hidden"])
    if row["flavor"] == "gpt2":
        return 4 * hidden
    return math.ceil(math.ceil(8 * hidden / 3) / 4) * 4


def moe_of(row):
    """docs/design.md §2's mixture-of-experts columns, with their defaults; None for a dense model."""
    experts = int(row.get("experts") or 0)
    if experts < 2:
        return None
    aux = row.get("aux_loss")
    return {"experts": experts, "top_k": int(row.get("top_k") or 2), "dense_layers": int(row.get("dense_layers") or 0),
            "shared": int(row.get("shared_experts") or 0), "ffn": int(row.get("expert_ffn") or 0) or ffn_size(row),
            "router": row.get("router") or "softmax", "alpha": float(aux) if aux not in (None, "") else 0.01,
            "gamma": float(row.get("expert_bias") or 0)}


def is_moe_layer(moe, layer):
    return moe is not None and layer >= moe["dense_layers"]


def expected_shapes(row):
    """Every parameter name and shape docs/design.md §2 gives this scenario, derived from its columns
    alone (never from the dump)."""
    flavor, hidden, vocab = row["flavor"], int(row["hidden"]), int(row["vocab"])
    layers, ffn, tied = int(row["layers"]), ffn_size(row), row["tied"] == "1"
    gpt2 = flavor == "gpt2"
    shapes = {"tok_embeddings.weight": (vocab, hidden)}
    if gpt2:
        shapes["pos_embeddings.weight"] = (int(row["seq_len"]), hidden)

    def norm(prefix):
        shapes[prefix + ".weight"] = (hidden,)
        if gpt2:
            shapes[prefix + ".bias"] = (hidden,)

    def linear(prefix, out_features, in_features):
        shapes[prefix + ".weight"] = (out_features, in_features)
        if gpt2:
            shapes[prefix + ".bias"] = (out_features,)

    heads = int(row["heads"])
    kv_width = int(row.get("kv_heads") or heads) * (hidden // heads)  # grouped-query attention
    for i in range(layers):
        p = f"layers.{i}."
        norm(p + "attention_norm")
        for n, out_features in (("wq", hidden), ("wk", kv_width), ("wv", kv_width), ("wo", hidden)):
            linear(p + "attention." + n, out_features, hidden)
        norm(p + "ffn_norm")
        moe = moe_of(row)
        if is_moe_layer(moe, i):
            shapes[p + "feed_forward.router.weight"] = (moe["experts"], hidden)
            names = [f"experts.{e}" for e in range(moe["experts"])] + (["shared"] if moe["shared"] else [])
            for name in names:
                shapes[p + f"feed_forward.{name}.w1.weight"] = (moe["ffn"], hidden)
                shapes[p + f"feed_forward.{name}.w2.weight"] = (hidden, moe["ffn"])
                shapes[p + f"feed_forward.{name}.w3.weight"] = (moe["ffn"], hidden)
            continue
        linear(p + "feed_forward.w1", ffn, hidden)
        linear(p + "feed_forward.w2", hidden, ffn)
        if not gpt2:
            linear(p + "feed_forward.w3", ffn, hidden)
    norm("norm")
    if not tied:
        shapes["output.weight"] = (vocab, hidden)
    return shapes


def labels_from(tokens, lengths):
    """docs/design.md §2: the next token, -100 on padding and on each sequence's last position."""
    labels = torch.full_like(tokens, -100)
    for b, length in enumerate(lengths.tolist()):
        labels[b, : length - 1] = tokens[b, 1:length]
    return labels


def microbatch_sizes(batch, microbatches):
    return [batch // microbatches + (1 if i < batch % microbatches else 0) for i in range(microbatches)]


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


def linear(x, params, prefix, has_bias):
    return F.linear(x, params[prefix + ".weight"], params[prefix + ".bias"] if has_bias else None)


def swiglu(h, params, prefix):
    up = F.silu(F.linear(h, params[prefix + ".w1.weight"])) * F.linear(h, params[prefix + ".w3.weight"])
    return F.linear(up, params[prefix + ".w2.weight"])


def moe_forward(h, params, prefix, moe, lengths, batch_sequences):
    """One mixture-of-experts feed-forward, computed densely: every expert on every token, weighted
    by a gate matrix that is zero off each token's top k. Returns the output, the layer's
    sequence-wise balance-loss term and its routing counts (E) over the sequences' own positions.
    The expert biases start at zero, so the first step chooses by the scores alone."""
    B, T, _ = h.shape
    E, k = moe["experts"], moe["top_k"]
    logits = h @ params[prefix + ".router.weight"].T                     # (B, T, E), float64 here
    scores = torch.softmax(logits, -1) if moe["router"] == "softmax" else torch.sigmoid(logits)
    s = scores.detach()
    # Expert e is chosen when fewer than k experts beat it: a higher score, or an equal one at a
    # lower index (ties go to the lower index).
    index = torch.arange(E)
    beats = (s[..., None, :] > s[..., :, None]) | ((s[..., None, :] == s[..., :, None]) & (index[None, :] < index[:, None]))
    chosen = beats.sum(-1) < k                                            # (B, T, E) bool
    top = scores * chosen
    valid = (torch.arange(T)[None, :] < lengths[:, None]).to(h.dtype)    # (B, T)
    gates = top / top.sum(-1, keepdim=True) * valid[..., None]            # padding is not dispatched
    out = sum(gates[..., e:e + 1] * swiglu(h, params, f"{prefix}.experts.{e}") for e in range(E))
    if moe["shared"]:
        out = out + swiglu(h, params, prefix + ".shared")
    length = lengths.to(h.dtype)[:, None]                                 # (B, 1)
    f = E / (k * length) * (chosen.to(h.dtype) * valid[..., None]).sum(1)  # (B, E), no gradient
    probs = scores if moe["router"] == "softmax" else scores / scores.sum(-1, keepdim=True)
    P = (probs * valid[..., None]).sum(1) / length
    aux = moe["alpha"] / batch_sequences * (f * P).sum()
    counts = (chosen.to(torch.int64) * (valid[..., None] > 0)).sum((0, 1))  # (E)
    return out, aux, counts


def forward(params, row, tokens, lengths, batch_sequences=None, counts=None):
    flavor = row["flavor"]
    heads = int(row["heads"])
    kv_heads = int(row.get("kv_heads") or heads)
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

    moe = moe_of(row)
    aux = torch.zeros((), dtype=torch.float64)
    for i in range(layers):
        p = f"layers.{i}."
        h = norm(x, p + "attention_norm")
        gpt2 = flavor == "gpt2"
        q, k, v = (linear(h, params, p + f"attention.{n}", gpt2) for n in ("wq", "wk", "wv"))
        q = q.view(B, T, heads, hd).transpose(1, 2)
        k, v = (t.view(B, T, kv_heads, hd).transpose(1, 2) for t in (k, v))
        if flavor == "llama":
            q, k = rotary(q, pos), rotary(k, pos)
        # Grouped-query attention: query head h reads key/value head h // (heads // kv_heads).
        group = torch.arange(heads) // (heads // kv_heads)
        k, v = k[:, group], v[:, group]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        attn = attn.transpose(1, 2).reshape(B, T, hidden)
        x = x + linear(attn, params, p + "attention.wo", gpt2)
        h = norm(x, p + "ffn_norm")
        if is_moe_layer(moe, i):
            out, term, layer_counts = moe_forward(h, params, p + "feed_forward", moe, lengths, batch_sequences or B)
            x = x + out
            aux = aux + term
            if counts is not None:
                counts[i] = layer_counts
        elif flavor == "llama":
            up = F.silu(F.linear(h, params[p + "feed_forward.w1.weight"])) * F.linear(h, params[p + "feed_forward.w3.weight"])
            x = x + F.linear(up, params[p + "feed_forward.w2.weight"])
        else:
            up = F.gelu(linear(h, params, p + "feed_forward.w1", True), approximate="tanh")
            x = x + linear(up, params, p + "feed_forward.w2", True)
    x = norm(x, "norm")
    head = params["tok_embeddings.weight"] if tied else params["output.weight"]
    return F.linear(x, head), aux


def check_dump(directory, suite_row):
    """suite_row: the scenario as the suite file states it (empty cells: the defaults of docs/scenarios.md)."""
    with open(os.path.join(directory, "scenario.csv"), newline="") as f:
        row = next(csv.DictReader(f))
    # Shapes come from the suite's own columns and docs/design.md §2, never from what the dump says.
    row = dict(row, ffn=suite_row.get("ffn") or "",
               **{c: suite_row.get(c) or "" for c in ("experts", "top_k", "dense_layers", "shared_experts",
                                                      "expert_ffn", "router", "aux_loss", "expert_bias")})
    dumped_ffn = int(next(csv.DictReader(open(os.path.join(directory, "scenario.csv"), newline="")))["ffn"])
    if dumped_ffn != ffn_size(row):
        return [f"scenario.csv says ffn {dumped_ffn}, docs/design.md §2 gives {ffn_size(row)}"]
    weights = torch.load(os.path.join(directory, "weights.pt"), weights_only=False)
    batch = torch.load(os.path.join(directory, "batch.pt"), weights_only=False)
    grads = torch.load(os.path.join(directory, "grads.pt"), weights_only=False)
    dumped_loss = torch.load(os.path.join(directory, "loss.pt"), weights_only=False)
    expected_loss = dumped_loss["loss"]

    problems = []
    shapes = expected_shapes(row)
    if set(weights) != set(shapes):
        return [f"weights.pt names differ from docs/design.md §2: missing {sorted(set(shapes) - set(weights))}, "
                f"unexpected {sorted(set(weights) - set(shapes))}"]
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            problems.append(f"weight {name} has shape {tuple(weights[name].shape)}, docs/design.md §2 gives {shape}")
    if problems:
        return problems

    tokens, lengths = batch["tokens"], batch["lengths"]
    labels = labels_from(tokens, lengths)
    if not torch.equal(labels, batch["labels"]):
        problems.append("batch.pt labels differ from the next-token labels derived from tokens and lengths")
    valid = (labels != -100).sum()

    # Whole batch, as the reference computes it.
    params = {name: weights[name].clone().requires_grad_(True) for name in shapes}
    counts = {}
    logits, aux = forward(params, row, tokens, lengths, counts=counts)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100, reduction="sum") / valid + aux
    loss.backward()
    if moe_of(row) is not None and moe_of(row)["alpha"] > 0:
        if "aux_loss" not in dumped_loss:
            problems.append("loss.pt has no aux_loss for a mixture of experts with a balance loss")
        elif abs(dumped_loss["aux_loss"].item() - aux.item()) > TOLERANCE * max(1.0, abs(aux.item())):
            problems.append(f"balance loss {dumped_loss['aux_loss'].item():.15g} vs python {aux.item():.15g}")
        elif aux.item() <= 0:
            problems.append(f"balance loss {aux.item():.3g}: a mixture of experts with aux_loss > 0 must have one")

    # Auxiliary-loss-free balancing: from zeros, bias_e = γ · sign(mean count − count_e) after the
    # step, the counts over the whole batch's own positions.
    moe = moe_of(row)
    bias_path = os.path.join(directory, "bias.pt")
    if moe is not None and moe["gamma"] > 0:
        if not os.path.exists(bias_path):
            problems.append("no bias.pt for a mixture of experts with expert_bias > 0")
        else:
            biases = torch.load(bias_path, weights_only=False)
            expected = {f"layers.{i}.feed_forward.expert_bias": moe["gamma"] * torch.sign(c.double().mean() - c.double())
                        for i, c in counts.items()}
            if set(biases) != set(expected):
                problems.append(f"bias.pt names {sorted(biases)}, expected {sorted(expected)}")
            for name, bias in expected.items():
                if name in biases and not torch.equal(biases[name].double(), bias):
                    problems.append(f"{name} after the step: {biases[name].tolist()} vs python {bias.tolist()}")
    elif os.path.exists(bias_path):
        problems.append("bias.pt without expert_bias")

    # Microbatched, as a pipeline computes it: contiguous microbatches, each padded only to its
    # own longest sequence, each normalised by the whole batch's tokens, gradients summed.
    microbatches = int(row.get("microbatches") or 1)
    mb_params = {name: weights[name].clone().requires_grad_(True) for name in shapes}
    mb_loss = 0.0
    first = 0
    for size in microbatch_sizes(tokens.shape[0], microbatches):
        part_lengths = lengths[first:first + size]
        time = int(part_lengths.max())
        part_tokens = tokens[first:first + size, :time]
        part_labels = labels_from(part_tokens, part_lengths)
        part_logits, part_aux = forward(mb_params, row, part_tokens, part_lengths, batch_sequences=tokens.shape[0])
        part_loss = F.cross_entropy(part_logits.reshape(-1, part_logits.shape[-1]), part_labels.reshape(-1),
                                    ignore_index=-100, reduction="sum") / valid + part_aux
        part_loss.backward()
        mb_loss += part_loss.item()
        first += size
    loss_diff = abs(loss.item() - expected_loss.item())
    if loss_diff > TOLERANCE:
        problems.append(f"loss {expected_loss.item():.15g} vs python {loss.item():.15g} (diff {loss_diff:.3g})")
    if abs(mb_loss - expected_loss.item()) > TOLERANCE:
        problems.append(f"loss {expected_loss.item():.15g} vs python over {microbatches} microbatches {mb_loss:.15g}")
    # An expert no token chose gets no gradient at all (dropless dispatch runs nothing for it):
    # absent from grads.pt, and exactly zero here, where every expert runs on every token.
    unrouted = {name for name in set(shapes) - set(grads) if ".experts." in name and not params[name].grad.any()}
    if set(grads) | unrouted != set(shapes):
        problems.append(f"grads.pt names differ from docs/design.md §2: missing {sorted(set(shapes) - set(grads))}, "
                        f"unexpected {sorted(set(grads) - set(shapes))}")
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
        mb_rel = (grads[name] - mb_params[name].grad).norm().item() / denom
        if mb_rel > TOLERANCE:
            problems.append(f"gradient {name} over {microbatches} microbatches: relative error {mb_rel:.3g}")
    print(f"  loss {loss.item():.12f} (diff {loss_diff:.2e}), worst gradient rel err {worst[0]:.2e} {worst[1]}, "
          f"{len(params)} parameters, {int(valid)} tokens, {microbatches} microbatch(es) agree")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipecheck", required=True, help="path to the pipecheck binary")
    parser.add_argument("--scenarios", required=True, help="scenario CSV; every row is dumped and checked")
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)

    with open(args.scenarios, newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(line for line in f if not line.startswith("#"))}
    names = list(rows)
    failures = 0
    for name in names:
        out = os.path.join(args.workdir, name)
        subprocess.run([args.pipecheck, "dump", "--scenarios", args.scenarios, "--scenario", name, "--out", out],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"{name}:")
        problems = check_dump(out, rows[name])
        for problem in problems:
            print(f"  FAIL {problem}")
        failures += bool(problems)
    print(f"{len(names) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
