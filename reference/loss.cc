// Token-normalised cross entropy (see loss.h).
#include "reference/loss.h"

#include <torch/nn/functional/loss.h>

#include "reference/data.h"

namespace pipecheck::reference {
namespace {

torch::Tensor LossLogits(const torch::Tensor& logits) {
  return logits.scalar_type() == torch::kFloat64 ? logits : logits.to(torch::kFloat32);
}

}  // namespace

torch::Tensor TokenLosses(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t vocab = logits.size(-1);
  auto flat = torch::nn::functional::cross_entropy(
      LossLogits(logits).reshape({-1, vocab}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kNone));
  return flat.view(labels.sizes());  // (B, T)
}

torch::Tensor TokenLossSum(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t vocab = logits.size(-1);
  return torch::nn::functional::cross_entropy(
      LossLogits(logits).reshape({-1, vocab}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

}  // namespace pipecheck::reference
