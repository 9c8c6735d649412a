#!/usr/bin/env python3
"""The protocol's mixture-of-experts layer (trainers/protocol.py MoeFeedForward: grouped dropless
dispatch, the balance loss over each sequence's own positions) against the cross-check's
independent dense formulation (tests/crosscheck_dump.py moe_forward: every expert on every token,
gated by a top-k mask), in float64: outputs, balance-loss terms and every gradient within 1e-12,
for the softmax and sigmoid routers, with and without a shared expert, top-1 and top-2, and
sequences of several lengths. Also: a tie goes to the lower index, an expert no token chose gets
no gradient from the grouped dispatch, and padding positions change neither the output of real positions nor the term."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "trainers"))
sys.path.insert(0, HERE)

from protocol import MoeFeedForward  # noqa: E402
import crosscheck_dump  # noqa: E402

TOLERANCE = 1e-12


def main():
    problems = []
    generator = torch.Generator().manual_seed(7)
    for router in ("softmax", "sigmoid"):
        for shared in (0, 1):
            for top_k in (1, 2):
                moe = {"experts": 4, "top_k": top_k, "dense_layers": 0, "shared_experts": shared, "expert_ffn": 24,
                       "router": router, "aux_loss": 0.01, "sequences_per_step": 8}
                torch.manual_seed(len(problems) + 10 * shared + top_k)
                layer = MoeFeedForward(32, moe).double()
                x = torch.randn(3, 7, 32, dtype=torch.float64, generator=generator, requires_grad=True)
                lengths = torch.tensor([7, 4, 5])
                out, aux = layer(x, lengths)
                (out.pow(2).sum() + aux).backward()
                ours = {name: p.grad for name, p in layer.named_parameters()}
                x_grad = x.grad.clone()
                params = {"ff." + name: p.detach().clone().requires_grad_(True) for name, p in layer.named_parameters()}
                x2 = x.detach().clone().requires_grad_(True)
                dense = {"experts": 4, "top_k": top_k, "dense_layers": 0, "shared": shared, "ffn": 24, "router": router,
                         "alpha": 0.01}
                out2, aux2, _ = crosscheck_dump.moe_forward(x2, params, "ff", dense, lengths, 8)
                (out2.pow(2).sum() + aux2).backward()
                case = f"router {router}, shared {shared}, top_k {top_k}"
                if (out - out2).abs().max().item() > TOLERANCE:
                    problems.append(f"{case}: output differs by {(out - out2).abs().max().item():.3g}")
                if abs(aux.item() - aux2.item()) > TOLERANCE or aux.item() <= 0:
                    problems.append(f"{case}: balance term {aux.item():.17g} vs {aux2.item():.17g}")
                if (x_grad - x2.grad).abs().max().item() > TOLERANCE:
                    problems.append(f"{case}: input gradient differs")
                for name, grad in ours.items():
                    theirs = params["ff." + name].grad
                    if grad is None:
                        if theirs.any():
                            problems.append(f"{case}: {name} got no gradient, the dense one has {theirs.abs().max():.3g}")
                    elif (grad - theirs).abs().max().item() > TOLERANCE:
                        problems.append(f"{case}: gradient of {name} differs by {(grad - theirs).abs().max().item():.3g}")
                # Padding: a longer padded tail leaves real positions and the term as they were.
                padded = torch.cat([x.detach(), torch.randn(3, 3, 32, dtype=torch.float64, generator=generator)], 1)
                out3, aux3 = layer(padded, lengths)
                if (out3[:, :7] - out.detach()).abs().max().item() > TOLERANCE or abs(aux3.item() - aux.item()) > TOLERANCE:
                    problems.append(f"{case}: padding positions changed the real positions' output or the term")
    # Experts 1 and 3 tie on every token: the lower index takes it (design §2), and an expert no
    # token chose gets no gradient: the grouped dispatch runs nothing for it.
    moe = {"experts": 4, "top_k": 1, "dense_layers": 0, "shared_experts": 0, "expert_ffn": 8, "router": "softmax",
           "aux_loss": 0.0, "sequences_per_step": 1}
    layer = MoeFeedForward(8, moe).double()
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[1, 0] = 1.0
        layer.router.weight[3, 0] = 1.0
    x = torch.zeros(1, 3, 8, dtype=torch.float64)
    x[..., 0] = 1.0
    out, aux = layer(x, torch.tensor([3]))
    out.sum().backward()
    routed = [e for e, expert in enumerate(layer.experts) if expert.w1.weight.grad is not None]
    if routed != [1] or aux is not None:
        problems.append(f"experts 1 and 3 tie on every token, so each must take 1, but experts {routed} got gradients "
                        f"(balance term {aux})")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("PASS: the protocol's MoE layer matches the dense formulation in 8 cases; ties go to the lower index; unrouted experts get no gradient")


if __name__ == "__main__":
    main()
