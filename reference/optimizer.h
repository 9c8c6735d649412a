// Optimiser construction and global-norm clipping with fixed hyper-parameters, so the
// reference and every pipeline stage apply bit-for-bit the same update rule.
// Not a scheduler: the learning rate is constant.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <vector>

namespace pipecheck::reference {

enum class OptimizerKind { kSgd, kAdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
};

// AdamW's settings beyond lr. SGD is plain: no momentum, no decay.
// eps is 1e-6, not PyTorch's 1e-8: an update's sensitivity to its gradient's rounding is up to
// lr / eps, and at 1e-8 the float32 rounding between a microbatched and a whole-batch gradient
// (~1e-10) becomes ~1e-5 of weight after one step, so parity at float32's 1e-4 would be lost by
// step 2 from arithmetic alone. At 1e-6 that drift is 100x smaller (measured: 4.2e-4 -> 2.7e-6).
constexpr double kAdamBeta1 = 0.9;
constexpr double kAdamBeta2 = 0.999;
constexpr double kAdamEps = 1e-6;
constexpr double kAdamWeightDecay = 0.01;

const char* OptimizerName(OptimizerKind kind);

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<torch::Tensor>& parameters);

// Sum of squares of every defined gradient, accumulated in float64.
double GradSquaredSum(const std::vector<torch::Tensor>& parameters);
// The same in two halves, so that a GPU step need not wait for it mid-step: each defined
// gradient's float64 sum of squares, queued on the gradients' device ((n,) float64; undefined
// when no gradient is defined), then their sum read on the host in parameter order.
torch::Tensor GradSquares(const std::vector<torch::Tensor>& parameters);
double SumOnHost(const torch::Tensor& squares);

// The factor clipping multiplies every gradient by: max_norm / (total_norm + 1e-6) when that
// is below 1 (PyTorch's clip_grad_norm_ rule), else 1. max_norm <= 0 means no clipping.
double ClipFactor(double total_norm, double max_norm);

// Multiplies every defined gradient by `factor` (no-op for 1).
void ScaleGradients(const std::vector<torch::Tensor>& parameters, double factor);

// `optimizer`'s step on one CPU thread, every trainer's alike. Elementwise as it is, LibTorch's
// AdamW split over two OpenMP threads was measured to give other bits for identical weights and
// gradients now and then (one thread's half of an 8192-element float64 tensor, 1e-12 apart):
// enough to tell a tied weight's two copies on one rank apart, and the update check's exactness
// rests on both trainers computing the same step from the same inputs. Costs nothing on a GPU.
void DeterministicStep(torch::optim::Optimizer& optimizer);

// One parameter's optimizer state, as a checkpoint holds it: AdamW's two moments and its step
// count; `present` false where the optimizer keeps none for it (SGD, or no step taken yet).
struct ParameterState {
  bool present = false;
  int64_t step = 0;
  torch::Tensor exp_avg, exp_avg_sq;
};

// `parameter`'s state in `optimizer` (its moments copied), and the same set back (copies of
// `state`'s, on the parameter's device, replacing whatever was there). Setting a state that is not
// `present` removes the parameter's.
ParameterState StateOf(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter);
void SetState(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter, const ParameterState& state);

}  // namespace pipecheck::reference
