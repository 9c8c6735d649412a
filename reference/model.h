// The decoder-only transformer as a *slice*: optional embedding, layers [first, end), optional
// final norm + head. The reference trainer builds the whole model as one slice; a pipeline
// stage builds its own, with the same global parameter names and the same initial values.
// Not a generation model: no KV cache, no sampling.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "reference/layers.h"
#include "reference/model_config.h"

namespace pipecheck::reference {

struct SliceSpec {
  int64_t first_layer = 0;
  int64_t end_layer = 0;  // exclusive; first == end is an empty slice of layers
  bool has_embedding = false;
  bool has_head = false;
};

// The whole model: embedding, every layer, head.
SliceSpec WholeModel(const ModelConfig& config);

class TransformerSliceImpl : public torch::nn::Module {
 public:
  TransformerSliceImpl(const ModelConfig& config, const SliceSpec& spec);

  // input: tokens (B, T) int64 with the embedding, else hidden states (B, T, hidden).
  // Returns logits (B, T, vocab) with the head, else hidden states (B, T, hidden).
  torch::Tensor forward(const torch::Tensor& input, const AttentionContext& context);

  const ModelConfig& config() const { return config_; }
  const SliceSpec& spec() const { return spec_; }

  // Boundary taps: every forward then keeps the hidden state entering each listed layer (the
  // embedding's output for the slice's first layer, the last block's output for its end), with
  // its gradient retained by the backward, so a pipeline's stage boundaries can be cut out of a
  // whole-model run. Layers outside [first_layer, end_layer] are never reached.
  void SetTaps(const std::vector<int64_t>& layers) { tapped_layers_ = {layers.begin(), layers.end()}; }
  // What the last forward kept, by layer: (B, T, hidden) each; handed over and forgotten here.
  std::map<int64_t, torch::Tensor> TakeTaps() { return std::move(taps_); }
  void pretty_print(std::ostream& stream) const override;

 private:
  torch::Tensor Embed(const torch::Tensor& tokens);
  torch::Tensor Head(const torch::Tensor& hidden);
  void Tap(int64_t layer, const torch::Tensor& hidden);

  ModelConfig config_;
  SliceSpec spec_;
  torch::nn::Embedding tok_embeddings_{nullptr};  // also the tied head's weight
  torch::nn::Embedding pos_embeddings_{nullptr};  // gpt2 only
  std::vector<TransformerBlock> blocks_;
  Norm norm_{nullptr};
  torch::nn::Linear output_{nullptr};  // untied only
  std::set<int64_t> tapped_layers_;
  std::map<int64_t, torch::Tensor> taps_;
};
TORCH_MODULE(TransformerSlice);

// A slice with every parameter set by InitializeParameters(seed), in `dtype` on `device`.
TransformerSlice BuildSlice(const ModelConfig& config, const SliceSpec& spec, uint64_t seed,
                            torch::Dtype dtype, torch::Device device);

// Name -> tensor, in registration order (parameters, gradients, expert biases).
using NamedTensors = torch::OrderedDict<std::string, torch::Tensor>;

// A module's expert biases (MoE layers with expert_bias > 0; the model's only buffers) under their
// global names `layers.{i}.feed_forward.expert_bias`, as detached copies; empty where none.
NamedTensors ExpertBiases(const torch::nn::Module& module);
// Overwrites the module's expert biases with `biases` (same names; an unknown name is an error).
void SetExpertBiases(torch::nn::Module& module, const NamedTensors& biases);

// Throws a clear error when this build cannot train in `dtype` on `device` (bfloat16 on a CPU
// without kernels for it, say), instead of failing somewhere inside the first step.
void CheckDtypeSupported(torch::Dtype dtype, torch::Device device);

}  // namespace pipecheck::reference
