// llama's RMSNorm normalisation, x · rsqrt(mean(x²) + eps), in one pass each way.
//
// Why: written with ATen's ops, the normalisation takes four kernels forward (the square, the
// mean, the sum with eps and its reciprocal root, the product) and about eight backward (the
// product's two gradients and a sum, the root's, the mean's expansion, the square's two
// products, and their sum), each a pass over a (tokens, hidden) tensor: measured on one thread of
// an Intel Xeon, about 0.45 ms of a llama layer's 16.8 for each of its two norms (forward and
// backward, 256 tokens, hidden 256).
//
// `RmsNormalize` computes each row's sum of squares and the gradient's row sum in float64 (eight
// partial sums, then their sum: the same order on every machine this binary runs on, compiled
// without floating-point contraction), rounds the row's scale to the tensor's dtype, and then
// takes the products as the composite does. So it is not the composite bit for bit: the
// composite's mean sums float32 in ATen's vector order, which depends on the CPU's vector width.
// A row's result depends on that row alone, so a microbatch's rows come out as the whole batch's.
// It saves what the composite saves, the input and the per-row scale, so the memory model is the
// same either way, and the weight's product stays ATen's own node outside it (the split
// backward's W starts there, as with the composite).
//
// It runs where the layer's products already leave ATen's arithmetic, float32 CPU layers of
// hidden × hidden weights on oneDNN (reference/linear.h): there the model is no longer ATen's bit
// for bit anyway. Everywhere else (PIPECHECK_CPU_GEMM=aten, small layers, float64, bfloat16, any
// non-CPU device) the norm is the composite, ATen's result bit for bit, which trainers written
// with ATen's ops match bitwise.
#pragma once

#include <torch/types.h>

namespace pipecheck::reference {

// x · rsqrt(mean(x², last dim) + eps), x of any shape (..., hidden).
torch::Tensor RmsNormalize(const torch::Tensor& x, double eps);

// The same through ATen's ops (what `RmsNormalize` falls back to, and what tests compare it with).
torch::Tensor RmsNormalizeComposite(const torch::Tensor& x, double eps);

// Whether `RmsNormalize` runs its own kernel for x (else the composite).
bool RmsNormFused(const torch::Tensor& x);

}  // namespace pipecheck::reference
