// llama's RMSNorm normalisation (see rms_norm.h). Compiled with -ffp-contract=off, so that every
// build rounds each product and sum where the source does.
#include "reference/rms_norm.h"

#include <torch/autograd.h>

#include <cmath>

#include "reference/linear.h"
#include "reference/parallel_rows.h"

namespace pipecheck::reference {
namespace {

// Partial sums a row is split into: independent chains, so the loop runs at the CPU's throughput
// rather than its latency; a fixed number, so the order is the same on every CPU.
constexpr int64_t kLanes = 8;

// Σ a[i]·b[i] over a row of `length`, in float64.
template <typename T>
double RowDot(const T* __restrict__ a, const T* __restrict__ b, int64_t length) {
  double partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= length; i += kLanes) {
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      partial[lane] += static_cast<double>(a[i + lane]) * static_cast<double>(b[i + lane]);
    }
  }
  for (; i < length; ++i) partial[i % kLanes] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  double sum = 0.0;
  for (double p : partial) sum += p;
  return sum;
}

// y = x · s, s = rsqrt(mean(x²) + eps) per row (rounded to T, and kept in `scale`).
template <typename T>
void Normalize(const torch::Tensor& x, double eps, torch::Tensor& y, torch::Tensor& scale) {
  const int64_t length = x.size(-1), rows = x.numel() / length;
  const T* xp = x.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  T* sp = scale.data_ptr<T>();
  ParallelRows(rows, length, [&](int64_t r) {
    const T* __restrict__ in = xp + r * length;
    T* __restrict__ out = yp + r * length;
    const double mean = RowDot(in, in, length) / static_cast<double>(length);
    const T s = static_cast<T>(1.0 / std::sqrt(mean + eps));
    sp[r] = s;
    for (int64_t i = 0; i < length; ++i) out[i] = in[i] * s;
  });
}

// dx = g·s − x·(s³ · Σ g·x / hidden) per row: the product's gradient and, through the scale, the
// mean's.
template <typename T>
void NormalizeBackward(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& scale, torch::Tensor& dx) {
  const int64_t length = x.size(-1), rows = x.numel() / length;
  const T* gp = g.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  const T* sp = scale.data_ptr<T>();
  T* dp = dx.data_ptr<T>();
  ParallelRows(rows, length, [&](int64_t r) {
    const T* __restrict__ grad = gp + r * length;
    const T* __restrict__ in = xp + r * length;
    T* __restrict__ out = dp + r * length;
    const T s = sp[r];
    const double s64 = static_cast<double>(s);
    const T c = static_cast<T>(s64 * s64 * s64 * RowDot(grad, in, length) / static_cast<double>(length));
    for (int64_t i = 0; i < length; ++i) out[i] = grad[i] * s - in[i] * c;
  });
}

class RmsNormalizeFunction : public torch::autograd::Function<RmsNormalizeFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, double eps) {
    auto y = at::empty_like(x, at::MemoryFormat::Contiguous);
    auto sizes = x.sizes().vec();
    sizes.back() = 1;
    auto scale = at::empty(sizes, x.options());
    Normalize<float>(x, eps, y, scale);
    ctx->save_for_backward({x, scale});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    const auto saved = ctx->get_saved_variables();
    const auto g = gradients[0].contiguous();
    auto dx = at::empty_like(saved[0], at::MemoryFormat::Contiguous);
    NormalizeBackward<float>(g, saved[0], saved[1], dx);
    return {dx, torch::Tensor()};
  }
};

}  // namespace

bool RmsNormFused(const torch::Tensor& x) {
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat32 || x.dim() < 1 || x.numel() == 0) return false;
  const int64_t hidden = x.size(-1);
  return x.is_contiguous() && LinearOnOneDnn(torch::kFloat32, x.device(), hidden, hidden);
}

torch::Tensor RmsNormalizeComposite(const torch::Tensor& x, double eps) {
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

torch::Tensor RmsNormalize(const torch::Tensor& x, double eps) {
  if (!RmsNormFused(x)) return RmsNormalizeComposite(x, eps);
  return RmsNormalizeFunction::apply(x, eps);
}

}  // namespace pipecheck::reference
