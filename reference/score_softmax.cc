// The attention's masked, scaled softmax (see score_softmax.h). Compiled with -ffp-contract=off:
// its one arithmetic operation is a division, rounded where the source has it on every build.
#include "reference/score_softmax.h"

#include <ATen/Functions.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>

#include "reference/parallel_rows.h"

namespace pipecheck::reference {
namespace {

// √head_dim as the composite's division sees it: a double scalar, which ATen rounds to the
// tensor's dtype (float32 and float64 divide by it as is).
template <typename T>
T Divisor(int64_t head_dim) {
  return static_cast<T>(std::sqrt(static_cast<double>(head_dim)));
}

// Every (batch, head, query) row of scores (B, H, T, T), with its row of the (B, 1, T, T) mask, in
// parallel (ParallelRows).
template <typename Row>
void ForEachRow(const torch::Tensor& scores, const Row& row) {
  const int64_t heads = scores.size(1), time = scores.size(2), length = scores.size(3);
  ParallelRows(scores.size(0) * heads * time, length, [&](int64_t r) {
    const int64_t batch = r / (heads * time), query = r % time;
    row(r * length, (batch * time + query) * length, length);
  });
}

// out = raw / d where keep, else −∞.
template <typename T>
void ScaleAndMask(const torch::Tensor& raw, const torch::Tensor& keep, T divisor, torch::Tensor& out) {
  const T* rp = raw.data_ptr<T>();
  const bool* kp = keep.data_ptr<bool>();
  T* op = out.data_ptr<T>();
  const T masked = -std::numeric_limits<T>::infinity();
  ForEachRow(raw, [&](int64_t at, int64_t mask_at, int64_t length) {
    const T* __restrict__ in = rp + at;
    const bool* __restrict__ k = kp + mask_at;
    T* __restrict__ o = op + at;
    for (int64_t j = 0; j < length; ++j) o[j] = k[j] ? in[j] / divisor : masked;
  });
}

// g = g / d where keep, else +0, in place.
template <typename T>
void MaskAndScaleGradient(torch::Tensor& g, const torch::Tensor& keep, T divisor) {
  const bool* kp = keep.data_ptr<bool>();
  T* gp = g.data_ptr<T>();
  ForEachRow(g, [&](int64_t at, int64_t mask_at, int64_t length) {
    const bool* __restrict__ k = kp + mask_at;
    T* __restrict__ o = gp + at;
    for (int64_t j = 0; j < length; ++j) o[j] = k[j] ? o[j] / divisor : T(0);
  });
}

class MaskedSoftmaxFunction : public torch::autograd::Function<MaskedSoftmaxFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& raw,
                               const torch::Tensor& keep, int64_t head_dim) {
    auto weights = MaskedSoftmaxForward(raw, keep, head_dim);
    ctx->save_for_backward({weights, keep});
    ctx->saved_data["head_dim"] = head_dim;
    return weights;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    const auto saved = ctx->get_saved_variables();
    const auto& weights = saved[0];
    const auto& keep = saved[1];
    const int64_t head_dim = ctx->saved_data["head_dim"].toInt();
    return {MaskedSoftmaxBackward(gradients[0], weights, keep, head_dim), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool MaskedSoftmaxFusedFor(torch::Dtype dtype, torch::Device device) {
  return device.is_cpu() && (dtype == torch::kFloat32 || dtype == torch::kFloat64);
}

bool MaskedSoftmaxMaskFits(const torch::Tensor& keep, torch::Device device, int64_t batch, int64_t rows,
                           int64_t columns) {
  return keep.scalar_type() == torch::kBool && keep.device() == device && keep.dim() == 4 && keep.is_contiguous() &&
         keep.size(0) == batch && keep.size(1) == 1 && keep.size(2) == rows && keep.size(3) == columns;
}

bool MaskedSoftmaxFused(const torch::Tensor& raw, const torch::Tensor& keep) {
  if (!MaskedSoftmaxFusedFor(raw.scalar_type(), raw.device())) return false;
  if (raw.dim() != 4 || !raw.is_contiguous() || raw.numel() == 0) return false;
  return MaskedSoftmaxMaskFits(keep, raw.device(), raw.size(0), raw.size(2), raw.size(3));
}

torch::Tensor MaskedSoftmaxForward(const torch::Tensor& raw, const torch::Tensor& keep, int64_t head_dim) {
  auto weights = at::empty_like(raw, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES(raw.scalar_type(), "MaskedSoftmax", [&] {
    ScaleAndMask<scalar_t>(raw, keep, Divisor<scalar_t>(head_dim), weights);
  });
  at::_softmax_out(weights, weights, -1, /*half_to_float=*/false);  // in place, elementwise
  return weights;
}

torch::Tensor MaskedSoftmaxBackward(const torch::Tensor& gradient, const torch::Tensor& weights,
                                    const torch::Tensor& keep, int64_t head_dim) {
  auto g = at::_softmax_backward_data(gradient, weights, -1, weights.scalar_type());
  if (!g.is_contiguous()) g = g.contiguous();
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "MaskedSoftmaxBackward", [&] {
    MaskAndScaleGradient<scalar_t>(g, keep, Divisor<scalar_t>(head_dim));
  });
  return g;
}

torch::Tensor MaskedSoftmaxComposite(const torch::Tensor& raw, const torch::Tensor& keep, int64_t head_dim) {
  auto scores = raw / std::sqrt(static_cast<double>(head_dim));
  scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
  return torch::softmax(scores, -1);
}

torch::Tensor MaskedSoftmax(const torch::Tensor& raw, const torch::Tensor& keep, int64_t head_dim) {
  if (!MaskedSoftmaxFused(raw, keep)) return MaskedSoftmaxComposite(raw, keep, head_dim);
  return MaskedSoftmaxFunction::apply(raw, keep, head_dim);
}

}  // namespace pipecheck::reference
