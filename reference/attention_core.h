// The attention between its projections: the heads' split, llama's rotary embedding, grouped-query
// attention's repeated key and value heads, softmax(masked(q·kᵀ / √d)) · v and the heads' merge,
// as two autograd nodes.
//
// Why: written with ATen's ops under autograd, this stretch of a layer is about two dozen graph
// nodes (each view, transpose and reshape of the heads, the expansions and foldings by which
// matmul makes its batched products, the products, the rotary and softmax kernels), and every one
// costs its dispatch, its node and its graph bookkeeping forward and backward, whatever the size of
// the tensors. A pipeline pays that once a microbatch where its reference pays it once a batch.
//
// `AttentionCore` runs the same operations on the same operands in the same layouts (the products
// on the very batches matmul folds them into, the rotary and softmax kernels of rotary.h and
// score_softmax.h, the gradients by each node's own formula), so its output and its gradients are
// the composite's bit for bit (tested). Its two nodes are the scores' (q and k to the softmax's
// weights) and the mix's (the weights and v to the merged heads): split there, each node's
// backward starts once the gradient it was handed is all it holds of the one before, and a
// backward never holds more than the composite's does at its height, the second product's
// gradients beside everything the attention saved. They save what the composite's nodes save (the
// folded query, key and value, the weights, the mask the stage's layers share); under a
// `SingleWalkBackward` guard each backward frees a saved tensor after its last use, as the
// composite's nodes free theirs, instead of when the node is done.
//
// It runs on the CPU in float32 and float64 where the rotary and softmax kernels run (contiguous
// (B, T, ·) projections, a (B, 1, T, T) bool mask, contiguous tables); anything else takes the
// composite.
#pragma once

#include <torch/types.h>

namespace pipecheck::reference {

// q (B, T, heads·d), k and v (B, T, kv_heads·d): the projections' outputs. keep (B, 1, T, T) bool.
// cos and sin (T, d) for llama's rotary embedding, undefined for none. Returns (B, T, heads·d).
torch::Tensor AttentionCore(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& keep, const torch::Tensor& cos, const torch::Tensor& sin,
                            int64_t heads, int64_t kv_heads);

// The same through ATen's ops (what `AttentionCore` falls back to, and what tests compare it with).
torch::Tensor AttentionCoreComposite(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& keep, const torch::Tensor& cos, const torch::Tensor& sin,
                                     int64_t heads, int64_t kv_heads);

// Whether `AttentionCore` runs as one node for these operands (else the composite).
bool AttentionCoreFused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& keep, const torch::Tensor& cos, const torch::Tensor& sin,
                        int64_t heads, int64_t kv_heads);

// While one is alive on this thread, every backward through the fused attention is its graph's
// only one (no retain_graph walk will come back through it), and frees each saved tensor after its
// last use. A second walk through a node that freed its tensors is an error, not a wrong result.
// The trainers hold one around their backward passes (and a split backward's I, where its W will
// not walk the input's side again).
class SingleWalkBackward {
 public:
  SingleWalkBackward();
  ~SingleWalkBackward();
  SingleWalkBackward(const SingleWalkBackward&) = delete;
  SingleWalkBackward& operator=(const SingleWalkBackward&) = delete;
};

}  // namespace pipecheck::reference
