// llama's rotary position embedding (see rotary.h). Compiled with -ffp-contract=off: a fused
// multiply-add would round the products' sum once instead of each product, and differ from the
// composite.
#include "reference/rotary.h"

#include <torch/autograd.h>

#include "reference/parallel_rows.h"

namespace pipecheck::reference {
namespace {

// Hugging Face's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of head_dim.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Visits every (batch, head, position) row of a (B, H, T, d) tensor whose last dimension is
// contiguous, in parallel (ParallelRows), handing `row` the element offsets of the row in `a` and
// in `b` and its position.
template <typename Row>
void ForEachRow(const torch::Tensor& a, const torch::Tensor& b, const Row& row) {
  const int64_t heads = a.size(1), time = a.size(2);
  ParallelRows(a.size(0) * heads * time, a.size(3), [&](int64_t r) {
    const int64_t t = r % time, h = (r / time) % heads, n = r / (time * heads);
    row(n * a.stride(0) + h * a.stride(1) + t * a.stride(2), n * b.stride(0) + h * b.stride(1) + t * b.stride(2), t);
  });
}

// out = in · cos + R(in · sin), each product rounded, then the sum, as the composite's kernels
// do. Forward (`kTranspose` false) R is rotate_half, (x1, x2) -> (−x2, x1), with sin taken at the
// output's element ((−x)·s is −(x·s) exactly); backward it is its transpose, (g1, g2) -> (g2, −g1),
// with sin taken at the element it came from, as the composite's gradient, whose slices' zero
// padding adds nothing but a zero's sign.
template <typename T, bool kTranspose>
void Rotate(const torch::Tensor& in, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t d = in.size(3), half = d / 2;
  const T* ip = in.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  ForEachRow(in, out, [&](int64_t io, int64_t oo, int64_t t) {
    const T* __restrict__ x = ip + io;
    T* __restrict__ y = op + oo;
    const T* __restrict__ c = cp + t * d;
    const T* __restrict__ s = sp + t * d;
    for (int64_t i = 0; i < half; ++i) {  // the partner of element i is i + half
      const T straight = x[i] * c[i];
      const T rotated = x[i + half] * s[kTranspose ? i + half : i];
      y[i] = kTranspose ? straight + rotated : straight - rotated;
    }
    for (int64_t i = half; i < d; ++i) {  // and of element i ≥ half, i − half
      const T straight = x[i] * c[i];
      const T rotated = x[i - half] * s[kTranspose ? i - half : i];
      y[i] = kTranspose ? straight - rotated : straight + rotated;
    }
  });
}

// Rows whose head_dim is contiguous and even, tables (time, head_dim) contiguous on x's device, one dtype.
bool Fits(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (x.dim() != 4 || x.size(3) % 2 != 0 || x.stride(3) != 1) return false;
  const auto dtype = x.scalar_type();
  if (cos.scalar_type() != dtype || sin.scalar_type() != dtype) return false;
  if (cos.device() != x.device() || sin.device() != x.device()) return false;  // the kernel reads them beside x
  for (const auto* table : {&cos, &sin}) {
    if (table->dim() != 2 || table->size(0) != x.size(2) || table->size(1) != x.size(3) || !table->is_contiguous()) {
      return false;
    }
  }
  return true;
}

// An output of x's strides where x is dense (as an elementwise kernel's), else contiguous.
torch::Tensor OutputLike(const torch::Tensor& x) {
  auto out = at::empty_like(x);
  return out.stride(3) == 1 ? out : at::empty_like(x, at::MemoryFormat::Contiguous);
}

// The rotation (kTranspose false) or its transpose of `in`, float32 or float64, into a new tensor.
template <bool kTranspose>
torch::Tensor Rotated(const torch::Tensor& in, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto out = OutputLike(in);
  if (in.scalar_type() == torch::kFloat64) {
    Rotate<double, kTranspose>(in, cos, sin, out);
  } else {
    Rotate<float, kTranspose>(in, cos, sin, out);
  }
  return out;
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return Rotated<false>(x, cos, sin);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    const auto saved = ctx->get_saved_variables();
    return {RotaryKernel(gradients[0], saved[0], saved[1], /*transpose=*/true), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool RotaryFused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto dtype = x.scalar_type();
  return x.device().is_cpu() && (dtype == torch::kFloat32 || dtype == torch::kFloat64) && x.numel() > 0 &&
         !cos.requires_grad() && !sin.requires_grad() && Fits(x, cos, sin);
}

torch::Tensor RotaryComposite(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

torch::Tensor RotaryKernel(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool transpose) {
  if (!transpose) return Rotated<false>(x, cos, sin);
  return Rotated<true>(x.stride(3) == 1 ? x : x.contiguous(), cos, sin);
}

torch::Tensor Rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (!RotaryFused(x, cos, sin)) return RotaryComposite(x, cos, sin);
  return RotaryFunction::apply(x, cos, sin);
}

}  // namespace pipecheck::reference
