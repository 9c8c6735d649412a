// The shape of the decoder-only transformer both trainers build (docs/design.md §2).
// Plain data: no LibTorch, so loaders and schedulers can use it cheaply.
#pragma once

#include <cstdint>
#include <string>

namespace pipecheck::reference {

enum class Flavor { kLlama, kGpt2 };

// How a mixture-of-experts router turns its logits into scores: a softmax over the experts, or
// each logit's sigmoid (DeepSeek-V3).
enum class Router { kSoftmax, kSigmoid };

const char* FlavorName(Flavor flavor);

struct ModelConfig {
  Flavor flavor = Flavor::kLlama;
  int64_t layers = 4;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // key/value heads of grouped-query attention (dividing heads); 0: heads
  int64_t ffn = 0;  // 0: the flavour's default (see FfnSize)
  int64_t vocab = 256;
  int64_t max_seq_len = 32;  // rows of gpt2's learned position table
  bool tied = false;         // output projection weight IS the token-embedding weight
  // Mixture of experts (llama): experts >= 2 turns the feed-forward of every layer from
  // dense_layers on into a router over `experts` llama MLPs of expert_ffn (0: ffn), each token
  // taking its top_k, plus shared_experts (0 or 1) that every token passes through.
  int64_t experts = 0;
  int64_t top_k = 2;
  int64_t dense_layers = 0;
  int64_t shared_experts = 0;
  int64_t expert_ffn = 0;
  Router router = Router::kSoftmax;
  double aux_loss = 0.01;    // α of the sequence-wise balance loss; 0: none
  double expert_bias = 0.0;  // γ of the auxiliary-loss-free balancing; 0: off

  int64_t HeadDim() const { return hidden / heads; }
  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : heads; }
  // Rows of wk and wv: every key/value head's head dimension (hidden without grouping).
  int64_t KvWidth() const { return KvHeads() * HeadDim(); }
  // 4*hidden for gpt2; ceil(8*hidden/3) rounded up to a multiple of 4 for llama.
  int64_t FfnSize() const;
  bool HasExperts() const { return experts >= 2; }
  bool IsMoeLayer(int64_t layer) const { return HasExperts() && layer >= dense_layers; }
  int64_t ExpertFfnSize() const { return expert_ffn > 0 ? expert_ffn : FfnSize(); }
  // MoE layers among [first, end).
  int64_t MoeLayersIn(int64_t first, int64_t end) const;

  // Parameter counts, for balancing stages without building them.
  int64_t LayerParameterCount(int64_t layer) const;
  // Parameters of the layers [first, end).
  int64_t LayersParameterCount(int64_t first, int64_t end) const;
  int64_t EmbeddingParameterCount() const;  // token (and gpt2 position) embeddings
  int64_t HeadParameterCount() const;       // final norm and output matrix (a tied head's copy too)
  int64_t ParameterCount() const;           // embeddings, every layer and the head, as the three above count them
};

inline const char* FlavorName(Flavor flavor) { return flavor == Flavor::kLlama ? "llama" : "gpt2"; }

inline int64_t ModelConfig::FfnSize() const {
  if (ffn > 0) return ffn;
  if (flavor == Flavor::kGpt2) return 4 * hidden;
  const int64_t two_thirds = (8 * hidden + 2) / 3;  // ceil(8h/3)
  return (two_thirds + 3) / 4 * 4;
}

inline int64_t ModelConfig::MoeLayersIn(int64_t first, int64_t end) const {
  if (!HasExperts()) return 0;
  const int64_t from = first > dense_layers ? first : dense_layers;
  return end > from ? end - from : 0;
}

inline int64_t ModelConfig::LayerParameterCount(int64_t layer) const {
  const int64_t h = hidden, f = FfnSize(), kv = KvWidth();
  if (IsMoeLayer(layer)) {
    return 2 * h + 2 * h * h + 2 * kv * h + experts * h + (experts + shared_experts) * 3 * h * ExpertFfnSize();
  }
  if (flavor == Flavor::kLlama) return 2 * h + 2 * h * h + 2 * kv * h + 3 * h * f;
  return 2 * 2 * h + 2 * (h * h + h) + 2 * (kv * h + kv) + (h * f + f) + (f * h + h);
}

inline int64_t ModelConfig::EmbeddingParameterCount() const {
  return vocab * hidden + (flavor == Flavor::kGpt2 ? max_seq_len * hidden : 0);
}

inline int64_t ModelConfig::HeadParameterCount() const {
  return (flavor == Flavor::kGpt2 ? 2 : 1) * hidden + vocab * hidden;
}

inline int64_t ModelConfig::ParameterCount() const {
  return EmbeddingParameterCount() + HeadParameterCount() + LayersParameterCount(0, layers);
}

inline int64_t ModelConfig::LayersParameterCount(int64_t first, int64_t end) const {
  int64_t count = 0;
  for (int64_t layer = first; layer < end; ++layer) count += LayerParameterCount(layer);
  return count;
}

}  // namespace pipecheck::reference
