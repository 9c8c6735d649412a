// The transformer's building blocks, shared by the reference and the pipeline stages:
// norms, rotary attention, MLPs and the pre-norm block, for both flavours.
// Blocks hold parameters under their docs/design.md §2 local names (wq, w1, attention_norm, …);
// the global prefix `layers.{i}.` comes from where the owner registers them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "reference/model_config.h"

namespace pipecheck::reference {

// What every attention layer of one forward pass shares: built once per (micro)batch.
struct AttentionContext {
  torch::Tensor keep;  // (B, 1, T, T) bool: query t may attend key s (causal, s not padding)
  torch::Tensor cos;   // (T, head_dim) llama rotary tables in the model dtype; undefined for gpt2
  torch::Tensor sin;   // (T, head_dim)
};

// lengths: (B) int64 valid tokens per sequence; the batch is padded to `time` positions.
AttentionContext MakeAttentionContext(const ModelConfig& config, const torch::Tensor& lengths,
                                      int64_t time, torch::Dtype dtype, torch::Device device);

// RMSNorm for llama, LayerNorm (eps 1e-5, weight and bias) for gpt2, under one name.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(Flavor flavor, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

 private:
  Flavor flavor_;
  int64_t hidden_;
  torch::Tensor weight_;
  torch::Tensor bias_;  // gpt2 only
};
TORCH_MODULE(Norm);

// Multi-head causal self-attention: wq wk wv wo (biases for gpt2), rotary q/k for llama.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const AttentionContext& context);

 private:
  ModelConfig config_;
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
};
TORCH_MODULE(Attention);

// llama: w2(silu(w1 x) * w3 x) without bias; gpt2: w2(gelu_tanh(w1 x)) with biases.
class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Flavor flavor_;
  torch::nn::Linear w1_{nullptr}, w2_{nullptr}, w3_{nullptr};
};
TORCH_MODULE(FeedForward);

// h = x + Attn(Norm(x)); y = h + MLP(Norm(h)).
class TransformerBlockImpl : public torch::nn::Module {
 public:
  explicit TransformerBlockImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const AttentionContext& context);

 private:
  Norm attention_norm_{nullptr};
  Attention attention_{nullptr};
  Norm ffn_norm_{nullptr};
  FeedForward feed_forward_{nullptr};
};
TORCH_MODULE(TransformerBlock);

}  // namespace pipecheck::reference
