// The loss: cross entropy summed over every labelled token, divided by the number of labelled
// tokens of the *whole batch* (not a mean of per-microbatch means), so a pipeline that sums
// its microbatches' TokenLossSum / batch tokens gets exactly the reference's loss.
#pragma once

#include <torch/types.h>

namespace pipecheck::reference {

// logits (B, T, vocab), labels (B, T) -> per-token cross entropy (B, T), 0 where ignored.
// Computed in float64 for float64 logits, else in float32.
torch::Tensor TokenLosses(const torch::Tensor& logits, const torch::Tensor& labels);

// Sum of TokenLosses: a 0-dim tensor. Divide by the whole batch's valid-token count.
torch::Tensor TokenLossSum(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace pipecheck::reference
