// Optimisers and clipping (see optimizer.h).
#include "reference/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <ATen/Parallel.h>
#include <torch/utils.h>

namespace pipecheck::reference {

const char* OptimizerName(OptimizerKind kind) { return kind == OptimizerKind::kSgd ? "sgd" : "adamw"; }

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                                       const std::vector<torch::Tensor>& parameters) {
  if (config.kind == OptimizerKind::kSgd) {
    return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(config.lr));
  }
  return std::make_unique<torch::optim::AdamW>(
      parameters, torch::optim::AdamWOptions(config.lr)
                      .betas({kAdamBeta1, kAdamBeta2})
                      .eps(kAdamEps)
                      .weight_decay(kAdamWeightDecay));
}

torch::Tensor GradSquares(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> squares;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) squares.push_back(parameter.grad().to(torch::kFloat64).pow(2).sum());
  }
  return squares.empty() ? torch::Tensor() : torch::stack(squares);
}

double SumOnHost(const torch::Tensor& squares) {
  if (!squares.defined()) return 0.0;
  // One read for all of them (on a GPU, one wait instead of one per parameter), added up on the
  // host in parameter order.
  const auto host = squares.cpu();  // (parameters with a gradient) float64
  const double* values = host.data_ptr<double>();
  double sum = 0.0;
  for (int64_t i = 0; i < host.numel(); ++i) sum += values[i];
  return sum;
}

double GradSquaredSum(const std::vector<torch::Tensor>& parameters) { return SumOnHost(GradSquares(parameters)); }

double ClipFactor(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double factor = max_norm / (total_norm + 1e-6);
  return factor < 1.0 ? factor : 1.0;
}

void DeterministicStep(torch::optim::Optimizer& optimizer) {
  const int threads = at::get_num_threads();
  if (threads > 1) at::set_num_threads(1);
  try {
    optimizer.step();
  } catch (...) {
    if (threads > 1) at::set_num_threads(threads);
    throw;
  }
  if (threads > 1) at::set_num_threads(threads);
}

void ScaleGradients(const std::vector<torch::Tensor>& parameters, double factor) {
  if (factor == 1.0) return;
  torch::NoGradGuard no_grad;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) parameter.grad().mul_(factor);
  }
}

ParameterState StateOf(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter) {
  ParameterState state;
  const auto found = optimizer.state().find(parameter.unsafeGetTensorImpl());
  if (found == optimizer.state().end()) return state;
  const auto* adam = dynamic_cast<const torch::optim::AdamWParamState*>(found->second.get());
  TORCH_CHECK(adam != nullptr, "only AdamW keeps optimizer state here");
  state.present = true;
  state.step = adam->step();
  state.exp_avg = adam->exp_avg().detach().clone();
  state.exp_avg_sq = adam->exp_avg_sq().detach().clone();
  return state;
}

void SetState(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter, const ParameterState& state) {
  void* key = parameter.unsafeGetTensorImpl();
  if (!state.present) {
    optimizer.state().erase(key);
    return;
  }
  auto adam = std::make_unique<torch::optim::AdamWParamState>();
  adam->step(state.step);
  adam->exp_avg(state.exp_avg.detach().to(parameter.device()).clone());
  adam->exp_avg_sq(state.exp_avg_sq.detach().to(parameter.device()).clone());
  optimizer.state()[key] = std::move(adam);
}

}  // namespace pipecheck::reference
