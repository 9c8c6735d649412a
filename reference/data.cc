// Synthetic data (see data.h).
#include "reference/data.h"

#include "reference/init.h"
#include "reference/torch_compat.h"

namespace pipecheck::reference {

Batch MakeBatchFromSequences(const torch::Tensor& tokens, const torch::Tensor& lengths, int64_t time,
                             int64_t pad_token) {
  const int64_t longest = lengths.max().item<int64_t>();
  TORCH_CHECK(time >= longest && tokens.size(1) >= longest, "cannot pad sequences of length ",
              longest, " to ", time, " positions from ", tokens.size(1), " tokens");
  auto positions = torch::arange(time, torch::kInt64);                 // (T)
  auto valid = positions.unsqueeze(0) < lengths.unsqueeze(1);          // (B, T)
  auto source = tokens.narrow(1, 0, std::min(time, tokens.size(1)));
  if (source.size(1) < time) {
    source = torch::cat({source, torch::zeros({tokens.size(0), time - source.size(1)}, torch::kInt64)}, 1);
  }
  Batch batch;
  batch.tokens = torch::where(valid, source, torch::full_like(source, pad_token));  // (B, T)
  // A label exists where the next position is still inside the sequence.
  auto has_next = (positions + 1).unsqueeze(0) < lengths.unsqueeze(1);  // (B, T)
  auto next = torch::roll(batch.tokens, -1, 1);
  batch.labels = torch::where(has_next, next, torch::full_like(next, kIgnoreIndex));
  batch.lengths = lengths.clone();
  batch.valid_tokens = has_next.sum().item<int64_t>();
  return batch;
}

namespace {

// A step's data stream; the lengths are its first draw, the tokens its second.
at::Generator DataGenerator(uint64_t seed, int64_t step) {
  return compat::MakeCpuGenerator(StreamSeed(seed, "data", static_cast<uint64_t>(step)));
}

torch::Tensor DrawLengths(const DataConfig& config, at::Generator& generator) {
  return torch::randint(config.seq_len_min, config.seq_len + 1, {config.batch}, generator, torch::kInt64);  // (B)
}

}  // namespace

torch::Tensor MakeLengths(const DataConfig& config, uint64_t seed, int64_t step) {
  auto generator = DataGenerator(seed, step);
  return DrawLengths(config, generator);
}

Batch MakeBatch(const DataConfig& config, uint64_t seed, int64_t step) {
  auto generator = DataGenerator(seed, step);
  auto lengths = DrawLengths(config, generator);                                   // (B)
  auto tokens = torch::randint(0, config.vocab, {config.batch, config.seq_len}, generator,
                               torch::kInt64);                                     // (B, seq_len)
  return MakeBatchFromSequences(tokens, lengths, lengths.max().item<int64_t>());
}

std::vector<int64_t> MicrobatchSizes(int64_t batch, int64_t microbatches) {
  TORCH_CHECK(microbatches >= 1 && microbatches <= batch, "cannot split a batch of ", batch,
              " sequences into ", microbatches, " microbatches");
  std::vector<int64_t> sizes(microbatches, batch / microbatches);
  for (int64_t i = 0; i < batch % microbatches; ++i) ++sizes[i];
  return sizes;
}

std::vector<Batch> SplitMicrobatches(const Batch& batch, int64_t microbatches) {
  std::vector<Batch> parts;
  int64_t start = 0;
  for (int64_t size : MicrobatchSizes(batch.size(), microbatches)) {
    auto lengths = batch.lengths.narrow(0, start, size);
    const int64_t time = lengths.max().item<int64_t>();
    Batch part;
    part.tokens = batch.tokens.narrow(0, start, size).narrow(1, 0, time).contiguous();  // (b, t)
    part.labels = batch.labels.narrow(0, start, size).narrow(1, 0, time).contiguous();  // (b, t)
    part.lengths = lengths.contiguous();
    part.valid_tokens = (part.labels != kIgnoreIndex).sum().item<int64_t>();
    parts.push_back(std::move(part));
    start += size;
  }
  return parts;
}

}  // namespace pipecheck::reference
