// Gradient sums across backward passes (see gradient_accumulation.h).
#include "reference/gradient_accumulation.h"

#include <torch/utils.h>

namespace pipecheck::reference {

bool AccumulatesInFloat32(torch::Dtype dtype) { return dtype == torch::kBFloat16 || dtype == torch::kFloat16; }

GradientAccumulator::GradientAccumulator(std::vector<torch::Tensor> parameters)
    : parameters_(std::move(parameters)), sums_(parameters_.size()) {
  for (const auto& parameter : parameters_) any_float32_sums_ = any_float32_sums_ || AccumulatesInFloat32(parameter.scalar_type());
}

void GradientAccumulator::Begin() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameters_[i].mutable_grad().reset();
    sums_[i] = torch::Tensor();
  }
}

void GradientAccumulator::AfterBackward() {
  if (!any_float32_sums_) return;  // float32/float64: .grad already holds the sum
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& parameter = parameters_[i];
    if (!AccumulatesInFloat32(parameter.scalar_type()) || !parameter.grad().defined()) continue;
    auto fresh = parameter.grad().to(torch::kFloat32);
    sums_[i] = sums_[i].defined() ? sums_[i].add_(fresh) : fresh;
    parameter.mutable_grad().reset();
  }
}

void GradientAccumulator::Finish() {
  AfterBackward();  // a backward whose gradients were not yet moved
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (sums_[i].defined()) parameters_[i].mutable_grad() = sums_[i];
    sums_[i] = torch::Tensor();
  }
}

void GradientsToParameterDtype(const std::vector<torch::Tensor>& parameters) {
  for (auto parameter : parameters) {  // a handle to the same tensor
    auto gradient = parameter.grad();
    if (gradient.defined() && gradient.scalar_type() != parameter.scalar_type()) {
      parameter.mutable_grad() = gradient.to(parameter.scalar_type());
    }
  }
}

}  // namespace pipecheck::reference
