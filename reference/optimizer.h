// Optimiser construction and global-norm clipping with fixed hyper-parameters, so the
// reference and every pipeline stage apply bit-for-bit the same update rule.
// Not a scheduler: the learning rate is constant.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace pipecheck::reference {

enum class OptimizerKind { kSgd, kAdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
};

// AdamW's settings beyond lr (PyTorch's defaults). SGD is plain: no momentum, no decay.
constexpr double kAdamBeta1 = 0.9;
constexpr double kAdamBeta2 = 0.999;
constexpr double kAdamEps = 1e-8;
constexpr double kAdamWeightDecay = 0.01;

const char* OptimizerName(OptimizerKind kind);

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<torch::Tensor>& parameters);

// Sum of squares of every defined gradient, accumulated in float64.
double GradSquaredSum(const std::vector<torch::Tensor>& parameters);

// The factor clipping multiplies every gradient by: max_norm / (total_norm + 1e-6) when that
// is below 1 (PyTorch's clip_grad_norm_ rule), else 1. max_norm <= 0 means no clipping.
double ClipFactor(double total_norm, double max_norm);

// Multiplies every defined gradient by `factor` (no-op for 1).
void ScaleGradients(const std::vector<torch::Tensor>& parameters, double factor);

}  // namespace pipecheck::reference
