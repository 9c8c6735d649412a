// The attention between its projections as one autograd node (see attention_core.h). Every step
// below names the composite's operation it stands for; the backward walks them in reverse with
// each node's own gradient formula, on the same layouts.
#include "reference/attention_core.h"

#include <ATen/ExpandUtils.h>
#include <torch/autograd.h>

#include "reference/rotary.h"
#include "reference/score_softmax.h"

namespace pipecheck::reference {
namespace {

// (B, T, n·d) -> (B, n, T, d), a view.
torch::Tensor SplitHeads(const torch::Tensor& t, int64_t count) {
  return t.view({t.size(0), t.size(1), count, t.size(2) / count}).transpose(1, 2);
}

// Grouped-query attention's repeat (Hugging Face's repeat_kv): (B, KV, T, d) -> (B, KV·group, T, d).
torch::Tensor Repeat(const torch::Tensor& t, int64_t group) {
  const int64_t batch = t.size(0), kv = t.size(1), time = t.size(2), d = t.size(3);
  return t.unsqueeze(2).expand({batch, kv, group, time, d}).reshape({batch, kv * group, time, d});
}

// `Repeat`'s gradient: its reshape's, its expansion's (a sum over the group) and its unsqueeze's.
torch::Tensor Unrepeat(const torch::Tensor& g, int64_t group) {
  const int64_t batch = g.size(0), kv = g.size(1) / group, time = g.size(2), d = g.size(3);
  const std::vector<int64_t> expanded{batch, kv, 1, time, d};
  return at::sum_to(g.reshape({batch, kv, group, time, d}), expanded).squeeze(2);
}

// (B, n, T, d) -> (B, T, n·d): the heads' merge, and the split's gradient (a copy).
torch::Tensor MergeHeads(const torch::Tensor& t) {
  return t.transpose(1, 2).reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// The rotary tables, or none (undefined): outside the functions' tensor inputs, which cannot be
// undefined.
struct Tables {
  torch::Tensor cos, sin;
};

// How many SingleWalkBackward guards are alive on this thread.
thread_local int single_walk = 0;

// The saved tensor `name` of a node; while a SingleWalkBackward guard is alive it leaves the node
// with it, so that it goes as soon as the caller drops it. The tensors live in `saved_data`, not
// in saved variables, for that: LibTorch frees saved variables only once the whole node has run.
// (Every tensor saved there is the node's own or a mask or table no one writes to, so the saved
// variables' version check has nothing to guard.)
torch::Tensor Take(torch::autograd::AutogradContext* ctx, const char* name) {
  auto found = ctx->saved_data.find(name);
  TORCH_CHECK(found != ctx->saved_data.end(), "the fused attention's saved ", name,
              " was freed by an earlier backward through it, run as walking the graph once "
              "(reference::SingleWalkBackward)");
  auto tensor = found->second.toTensor();
  if (single_walk > 0) ctx->saved_data.erase(found);
  return tensor;
}

// The scores' half: q and k's split into heads, their rotation and repetition, matmul's folding
// into (B·H) batches and its product, the masked softmax. Saves the folded q and k (as the
// composite's product does), the weights and the mask (as its softmax does).
class AttentionScoresFunction : public torch::autograd::Function<AttentionScoresFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& keep, const Tables& tables, int64_t heads, int64_t kv_heads) {
    const int64_t batch = q.size(0), time = q.size(1), d = q.size(2) / heads;
    auto qh = SplitHeads(q, heads), kh = SplitHeads(k, kv_heads);
    if (tables.cos.defined()) {
      qh = RotaryKernel(qh, tables.cos, tables.sin, /*transpose=*/false);
      kh = RotaryKernel(kh, tables.cos, tables.sin, /*transpose=*/false);
      ctx->saved_data["cos"] = tables.cos;
      ctx->saved_data["sin"] = tables.sin;
    }
    if (kv_heads != heads) kh = Repeat(kh, heads / kv_heads);
    // matmul(q, kᵀ): both folded into (B·H) batches (a copy where the layout needs one).
    auto q_batches = qh.reshape({batch * heads, time, d});
    auto k_batches = kh.transpose(-2, -1).reshape({batch * heads, d, time});
    auto weights = MaskedSoftmaxForward(q_batches.bmm(k_batches).view({batch, heads, time, time}), keep, d);
    ctx->saved_data["q"] = q_batches;
    ctx->saved_data["k"] = k_batches;
    ctx->saved_data["weights"] = weights.detach();  // the output: without its node (no cycle)
    ctx->saved_data["keep"] = keep;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["head_dim"] = d;
    return weights;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    auto weights = Take(ctx, "weights");
    const auto keep = Take(ctx, "keep");
    const int64_t batch = weights.size(0), heads = weights.size(1), time = weights.size(2);
    const int64_t kv_heads = ctx->saved_data["kv_heads"].toInt(), d = ctx->saved_data["head_dim"].toInt();
    // The softmax's; its weights go (the mix's node, which ran first, let go of them).
    auto scores_gradient = MaskedSoftmaxBackward(gradients[0], weights, keep, d);
    weights.reset();
    // The product's (bmm: self, then mat2), then matmul's unfolding.
    const auto s = scores_gradient.view({batch * heads, time, time});
    auto q_batches = Take(ctx, "q"), k_batches = Take(ctx, "k");
    auto q_gradient = s.bmm(k_batches.transpose(1, 2)).view({batch, heads, time, d});
    k_batches.reset();
    auto k_gradient = q_batches.transpose(1, 2).bmm(s).view({batch, heads, d, time}).transpose(-2, -1);
    q_batches.reset();
    scores_gradient.reset();
    if (kv_heads != heads) k_gradient = Unrepeat(k_gradient, heads / kv_heads);
    if (ctx->saved_data.count("cos") > 0) {
      const auto cos = Take(ctx, "cos"), sin = Take(ctx, "sin");
      q_gradient = RotaryKernel(q_gradient, cos, sin, /*transpose=*/true);
      k_gradient = RotaryKernel(k_gradient, cos, sin, /*transpose=*/true);
    }
    return {MergeHeads(q_gradient), MergeHeads(k_gradient), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// The mix's half: v's split into heads and repetition, matmul's folding and its product with the
// weights, the heads' merge. Saves the weights and the folded v, as the composite's product does.
class AttentionMixFunction : public torch::autograd::Function<AttentionMixFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& weights,
                               const torch::Tensor& v, int64_t kv_heads) {
    const int64_t batch = weights.size(0), heads = weights.size(1), time = weights.size(2);
    auto vh = SplitHeads(v, kv_heads);
    if (kv_heads != heads) vh = Repeat(vh, heads / kv_heads);
    const int64_t d = vh.size(3);
    auto v_batches = vh.reshape({batch * heads, time, d});
    auto mixed = weights.view({batch * heads, time, time}).bmm(v_batches).view({batch, heads, time, d});
    ctx->saved_data["weights"] = weights.detach();
    ctx->saved_data["v"] = v_batches;
    ctx->saved_data["kv_heads"] = kv_heads;
    return MergeHeads(mixed);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    auto weights = Take(ctx, "weights"), v_batches = Take(ctx, "v");
    const int64_t batch = weights.size(0), heads = weights.size(1), time = weights.size(2), d = v_batches.size(2);
    const int64_t kv_heads = ctx->saved_data["kv_heads"].toInt();
    // The merge's, then matmul's unfolding: (B, T, H·d) -> (B, H, T, d) -> (B·H, T, d), a copy.
    auto g = gradients[0].reshape({batch, time, heads, d}).transpose(1, 2).reshape({batch * heads, time, d});
    // The product's (bmm: self, then mat2).
    auto weights_gradient = g.bmm(v_batches.transpose(1, 2)).view({batch, heads, time, time});
    v_batches.reset();
    auto v_gradient = weights.view({batch * heads, time, time}).transpose(1, 2).bmm(g).view({batch, heads, time, d});
    weights.reset();
    g.reset();
    if (kv_heads != heads) v_gradient = Unrepeat(v_gradient, heads / kv_heads);
    return {weights_gradient, MergeHeads(v_gradient), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor AttentionCoreComposite(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& keep, const torch::Tensor& cos, const torch::Tensor& sin,
                                     int64_t heads, int64_t kv_heads) {
  const int64_t d = q.size(2) / heads;
  auto qh = SplitHeads(q, heads), kh = SplitHeads(k, kv_heads), vh = SplitHeads(v, kv_heads);
  if (cos.defined()) {
    qh = Rotary(qh, cos, sin);
    kh = Rotary(kh, cos, sin);
  }
  if (kv_heads != heads) {
    kh = Repeat(kh, heads / kv_heads);
    vh = Repeat(vh, heads / kv_heads);
  }
  // softmax(masked(q·kᵀ / √d)), the scaling and the mask in one pass (score_softmax.h).
  auto weights = MaskedSoftmax(torch::matmul(qh, kh.transpose(-2, -1)), keep, d);  // (B, H, T, T)
  return MergeHeads(torch::matmul(weights, vh));                                    // (B, T, H·d)
}

bool AttentionCoreFused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& keep, const torch::Tensor& cos, const torch::Tensor& sin,
                        int64_t heads, int64_t kv_heads) {
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3 || q.numel() == 0 || heads <= 0 || kv_heads <= 0) return false;
  if (heads % kv_heads != 0 || q.size(2) % heads != 0) return false;
  const auto dtype = q.scalar_type();
  if (!MaskedSoftmaxFusedFor(dtype, q.device()) || k.scalar_type() != dtype || v.scalar_type() != dtype) return false;
  if (k.device() != q.device() || v.device() != q.device()) return false;
  if (!q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous()) return false;
  const int64_t batch = q.size(0), time = q.size(1), d = q.size(2) / heads;
  if (k.size(0) != batch || v.size(0) != batch || k.size(1) != time || v.size(1) != time) return false;
  if (k.size(2) != kv_heads * d || v.size(2) != kv_heads * d) return false;
  if (!MaskedSoftmaxMaskFits(keep, q.device(), batch, time, time)) return false;  // the scores' mask
  if (!cos.defined() && !sin.defined()) return true;
  // The rotary kernel, on the heads' views it rotates.
  if (!cos.defined() || !sin.defined()) return false;
  return RotaryFused(SplitHeads(q, heads), cos, sin) && RotaryFused(SplitHeads(k, kv_heads), cos, sin);
}

torch::Tensor AttentionCore(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& keep, const torch::Tensor& cos, const torch::Tensor& sin,
                            int64_t heads, int64_t kv_heads) {
  if (!AttentionCoreFused(q, k, v, keep, cos, sin, heads, kv_heads)) {
    return AttentionCoreComposite(q, k, v, keep, cos, sin, heads, kv_heads);
  }
  const auto weights = AttentionScoresFunction::apply(q, k, keep, Tables{cos, sin}, heads, kv_heads);
  return AttentionMixFunction::apply(weights, v, kv_heads);
}

SingleWalkBackward::SingleWalkBackward() { ++single_walk; }

SingleWalkBackward::~SingleWalkBackward() { --single_walk; }

}  // namespace pipecheck::reference
