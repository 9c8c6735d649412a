// Deterministic synthetic data: a batch is a function of (seed, step) alone. Sequences have
// their own lengths, are padded on the right, and are labelled with the next token.
// Not a tokenizer or a dataset loader.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace pipecheck::reference {

constexpr int64_t kIgnoreIndex = -100;  // label of padding and of each sequence's last token

struct DataConfig {
  int64_t batch = 8;
  int64_t seq_len = 32;      // longest sequence
  int64_t seq_len_min = 32;  // shortest sequence; lengths are uniform in [min, seq_len]
  int64_t vocab = 256;
};

struct Batch {
  torch::Tensor tokens;   // (B, T) int64, padded with 0 past each length
  torch::Tensor labels;   // (B, T) int64: tokens[b, t + 1], or kIgnoreIndex
  torch::Tensor lengths;  // (B) int64
  int64_t valid_tokens = 0;  // labels != kIgnoreIndex in this batch

  int64_t size() const { return tokens.size(0); }
  int64_t time() const { return tokens.size(1); }
};

// The batch of `step`, padded to its longest sequence.
Batch MakeBatch(const DataConfig& config, uint64_t seed, int64_t step);

// The lengths (B) int64 of MakeBatch(config, seed, step)'s sequences, drawn alone: what a batch's
// shapes depend on, for sizing a run without making its tokens.
torch::Tensor MakeLengths(const DataConfig& config, uint64_t seed, int64_t step);

// A batch from tokens (B, >= max length) and lengths (B), padded to `time` positions
// (at least the longest length) with `pad_token`; labels follow the rules above.
Batch MakeBatchFromSequences(const torch::Tensor& tokens, const torch::Tensor& lengths, int64_t time,
                             int64_t pad_token = 0);

// Sizes of `microbatches` contiguous microbatches of `batch` sequences: the first
// batch % microbatches get one more, so sizes differ by at most one.
std::vector<int64_t> MicrobatchSizes(int64_t batch, int64_t microbatches);

// Splits contiguously; each microbatch is trimmed to its own longest sequence.
std::vector<Batch> SplitMicrobatches(const Batch& batch, int64_t microbatches);

}  // namespace pipecheck::reference
