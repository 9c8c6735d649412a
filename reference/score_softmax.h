// The attention's weights from its raw scores, softmax(masked(q·kᵀ / √head_dim)), with the scaling
// and the mask in one pass each way.
//
// Why: written with ATen's ops, the step from q·kᵀ to the weights takes a division, the mask's
// negation and a masked fill before the softmax, each a pass over a (batch, heads, time, time)
// tensor and each a fresh one; the backward takes the softmax's gradient, the fill's and the
// division's, again a pass and a fresh tensor each. On one thread of an Intel Xeon the scaling and
// the mask were 4% of a llama layer's time (8 × 256, 256-token microbatches, float32).
//
// `MaskedSoftmax` divides and masks in one pass of its own into a fresh tensor and runs ATen's
// softmax kernel on that tensor in place; its backward runs ATen's softmax-gradient kernel, then
// masks and divides that in place. Each element is what the composite computes, by the same
// operation on the same operands (x / √d with √d rounded to the dtype, −∞ where masked, ATen's
// softmax and softmax-gradient kernels, +0 where masked), so the result is the composite's bit
// for bit, forward and backward (tested). It saves the softmax's output, as the composite does,
// and the attention's keep mask, which every layer of a stage shares, where the composite saved a
// negated copy of the mask in every layer: a stage keeps b·t·t bytes for a microbatch instead of
// b·t·t a layer (pipeline/memory_model.cc counts it so), and a forward holds the same two
// score-sized tensors at its height.
//
// It runs on the CPU in float32 and float64 (contiguous scores, a (batch, 1, time, time) bool
// mask). bfloat16 (whose division by a scalar ATen rounds through a reciprocal) and other devices
// take the composite.
#pragma once

#include <torch/types.h>

namespace pipecheck::reference {

// softmax over the last dim of raw / √head_dim with −∞ where keep is false. raw (B, H, T, T),
// keep (B, 1, T, T) bool.
torch::Tensor MaskedSoftmax(const torch::Tensor& raw, const torch::Tensor& keep, int64_t head_dim);

// The same through ATen's ops (what `MaskedSoftmax` falls back to, and what tests compare it with).
torch::Tensor MaskedSoftmaxComposite(const torch::Tensor& raw, const torch::Tensor& keep, int64_t head_dim);

// Whether a model of this dtype on this device takes `MaskedSoftmax`'s own kernel (its operands'
// layout aside; the memory model asks this).
bool MaskedSoftmaxFusedFor(torch::Dtype dtype, torch::Device device);

// Whether `MaskedSoftmax` runs its own kernel for these operands (else the composite).
bool MaskedSoftmaxFused(const torch::Tensor& raw, const torch::Tensor& keep);

// Whether its kernel takes `keep` as the mask of (batch, ·, rows, columns) scores on `device`: the
// mask half of `MaskedSoftmaxFused`, for a caller that has not made the scores yet.
bool MaskedSoftmaxMaskFits(const torch::Tensor& keep, torch::Device device, int64_t batch, int64_t rows,
                           int64_t columns);

// `MaskedSoftmax`'s kernels outside autograd, for a caller that differentiates them itself (the
// fused attention, attention_core.h), where `MaskedSoftmaxFused(raw, keep)` holds: the weights,
// and the raw scores' gradient from the weights' (any strides).
torch::Tensor MaskedSoftmaxForward(const torch::Tensor& raw, const torch::Tensor& keep, int64_t head_dim);
torch::Tensor MaskedSoftmaxBackward(const torch::Tensor& gradient, const torch::Tensor& weights,
                                    const torch::Tensor& keep, int64_t head_dim);

}  // namespace pipecheck::reference
