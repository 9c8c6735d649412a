// The model's linear layers (see linear.h).
#include "reference/linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace pipecheck::reference {
namespace {

// mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
using PointwiseLinear = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   c10::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<c10::string_view>);

// The registered op, when this LibTorch was built with oneDNN, registers a CPU kernel for it, and
// declares it with the signature above (typed() refuses another).
std::optional<c10::TypedOperatorHandle<PointwiseLinear>> FindOneDnn() {
  if (!at::hasMKLDNN()) return std::nullopt;
  const auto handle = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return std::nullopt;
  try {
    return handle->typed<PointwiseLinear>();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

struct Choice {
  std::optional<c10::TypedOperatorHandle<PointwiseLinear>> onednn;  // nullopt: ATen's product
  std::string name;
};

Choice Choose() {
  Choice choice;
  auto found = FindOneDnn();
  const char* set = std::getenv("PIPECHECK_CPU_GEMM");
  const std::string wanted = set == nullptr || *set == '\0' ? "" : set;
  if (wanted == "aten" || (wanted.empty() && !found)) {
    choice.name = "aten";
  } else if (wanted == "onednn" || wanted.empty()) {
    if (!found) {
      throw std::runtime_error("PIPECHECK_CPU_GEMM=onednn: this LibTorch has no oneDNN linear "
                               "(mkldnn::_linear_pointwise); set PIPECHECK_CPU_GEMM=aten");
    }
    choice.onednn = found;
    choice.name = "onednn";
  } else {
    throw std::runtime_error("PIPECHECK_CPU_GEMM=" + wanted + ": expected onednn or aten");
  }
  return choice;
}

const Choice& TheChoice() {
  static const Choice choice = Choose();
  return choice;
}

// x · weightᵀ + bias on oneDNN: x (..., in) contiguous or not, weight (out, in) any strides.
torch::Tensor OneDnnProduct(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return TheChoice().onednn->call(x, weight, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// How many FusedWeightGradients guards are alive on this thread.
thread_local int fused_weight_gradients = 0;

// The weight's .grad, where this backward may add its gradient into it in place: a fusion guard is
// alive, gradients are not being differentiated (AccumulateGrad, too, adds in place only then,
// whoever else holds the .grad), the weight is a parameter (a leaf) with no tensor hook, and its
// gradient exists, dense and contiguous, of the weight's own shape and dtype. Returns nullptr where
// AccumulateGrad has to do it.
torch::Tensor* FusableGradient(const torch::Tensor& weight) {
  if (fused_weight_gradients == 0 || torch::GradMode::is_enabled()) return nullptr;  // create_graph: no
  if (!weight.is_leaf() || !weight.requires_grad() || !torch::autograd::impl::hooks(weight).empty()) return nullptr;
  auto& gradient = weight.mutable_grad();
  if (!gradient.defined() || gradient.is_sparse() || !gradient.is_contiguous() ||
      gradient.scalar_type() != weight.scalar_type() || gradient.device() != weight.device() ||
      gradient.sizes() != weight.sizes()) {
    return nullptr;
  }
  return &gradient;
}

// Autograd for one layer's product (an undefined tensor cannot be a custom function's input, so
// the layers with a bias and those without are two functions, sharing `Backward`).
torch::autograd::variable_list Backward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gradient,
                                        bool bias) {
  const auto saved = ctx->get_saved_variables();
  const auto& x = saved[0];
  const auto& weight = saved[1];
  torch::Tensor x_gradient, weight_gradient, bias_gradient;
  // dx = dy · W: the inner product with W's transpose as its weight (a view: no copy).
  if (ctx->needs_input_grad(0)) x_gradient = OneDnnProduct(gradient, weight.t(), torch::Tensor());
  const bool wants_bias = bias && ctx->needs_input_grad(2);
  if (ctx->needs_input_grad(1) || wants_bias) {
    const auto flat = gradient.reshape({-1, gradient.size(-1)});  // (N, out)
    // dW = dyᵀ · x on ATen, as ATen's own linear makes it for a row-major weight (mm_mat2_backward:
    // straight into the weight's layout, so the gradient is kept without a copy).
    // oneDNN's inner product would need dyᵀ as a contiguous copy.
    // Under a FusedWeightGradients guard, a later backward of the step adds dyᵀ · x into the
    // gradient the first one made (one product with beta = 1) and hands autograd none to add.
    if (ctx->needs_input_grad(1)) {
      if (torch::Tensor* sum = FusableGradient(weight)) {
        sum->addmm_(flat.t(), x.reshape({-1, x.size(-1)}));
      } else {
        weight_gradient = flat.t().mm(x.reshape({-1, x.size(-1)}));
      }
    }
    if (wants_bias) bias_gradient = flat.sum(0);
  }
  if (!bias) return {x_gradient, weight_gradient};
  return {x_gradient, weight_gradient, bias_gradient};
}

class OneDnnLinear : public torch::autograd::Function<OneDnnLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return OneDnnProduct(x, weight, torch::Tensor());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    return Backward(ctx, gradients[0], /*bias=*/false);
  }
};

class OneDnnAffine : public torch::autograd::Function<OneDnnAffine> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return OneDnnProduct(x, weight, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    return Backward(ctx, gradients[0], /*bias=*/true);
  }
};

// oneDNN's call costs about 10 us more than ATen's (primitive lookup, scratchpad), which its faster
// kernel repays only from about 2^20 multiply-adds: measured on one thread of the 2-core EPYC,
// ATen ÷ oneDNN time was 0.31 at 96 × 32 × 32 (tokens × in × out), 1.11 at 256 × 64 × 64, 1.76 at
// 256 × 128 × 128 and 2.23 at 256 × 256 × 684. The choice is the layer's, by its weight alone, so
// that the reference's whole batch and a pipeline's microbatch run the same kernel.
constexpr int64_t kOneDnnMinWeight = 128 * 128;

}  // namespace

bool LinearOnOneDnn(torch::Dtype dtype, torch::Device device, int64_t in, int64_t out) {
  return device.is_cpu() && dtype == torch::kFloat32 && in * out >= kOneDnnMinWeight && TheChoice().onednn.has_value();
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const bool onednn = x.numel() > 0 && weight.scalar_type() == torch::kFloat32 &&
                      LinearOnOneDnn(x.scalar_type(), x.device(), weight.size(1), weight.size(0));
  if (!onednn) return torch::nn::functional::linear(x, weight, bias);
  return bias.defined() ? OneDnnAffine::apply(x, weight, bias) : OneDnnLinear::apply(x, weight);
}

torch::Tensor Linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return Linear(x, layer->weight, layer->bias);
}

std::string CpuGemmName() { return TheChoice().name; }

FusedWeightGradients::FusedWeightGradients() { ++fused_weight_gradients; }

FusedWeightGradients::~FusedWeightGradients() { --fused_weight_gradients; }

}  // namespace pipecheck::reference
