// How gradients of several backward passes are summed, the same way in both trainers.
// float64 and float32 parameters accumulate in their own .grad, as autograd does. Reduced
// precision (bfloat16) parameters accumulate in float32, as Megatron's main_grad and FSDP's
// mixed precision do: each backward's bf16 gradient is added into a float32 sum, so the result
// does not depend on how many microbatches a batch was cut into. After Finish() the float32 sum
// is the parameter's .grad (that is what is clipped, summed between tied owners and compared);
// ToParameterDtype() rounds it to the parameter's dtype just before the optimizer step.
// Not an optimizer with master weights: parameters stay in their own dtype.
#pragma once

#include <torch/types.h>

#include <vector>

namespace pipecheck::reference {

// Whether `dtype` gets a float32 gradient sum (true for bfloat16 and float16).
bool AccumulatesInFloat32(torch::Dtype dtype);

class GradientAccumulator {
 public:
  explicit GradientAccumulator(std::vector<torch::Tensor> parameters);

  // Forget every sum and every parameter's .grad: the start of a step.
  void Begin();
  // After one backward: moves each reduced-precision parameter's fresh .grad into its float32 sum.
  void AfterBackward();
  // The step's backwards are done: each reduced-precision parameter's .grad becomes its sum.
  void Finish();

 private:
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> sums_;  // float32, parallel to parameters_; undefined until used
  bool any_float32_sums_ = false;    // whether any parameter accumulates in float32
};

// Rounds every .grad to its parameter's dtype (no-op where they already agree).
void GradientsToParameterDtype(const std::vector<torch::Tensor>& parameters);

}  // namespace pipecheck::reference
