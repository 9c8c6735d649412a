// The shape of the decoder-only transformer both trainers build (docs/design.md §2).
// Plain data: no LibTorch, so loaders and schedulers can use it cheaply.
#pragma once

#include <cstdint>
#include <string>

namespace pipecheck::reference {

enum class Flavor { kLlama, kGpt2 };

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

  int64_t HeadDim() const { return hidden / heads; }
  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : heads; }
  // Rows of wk and wv: every key/value head's head dimension (hidden without grouping).
  int64_t KvWidth() const { return KvHeads() * HeadDim(); }
  // 4*hidden for gpt2; ceil(8*hidden/3) rounded up to a multiple of 4 for llama.
  int64_t FfnSize() const;

  // Parameter counts, for balancing stages without building them.
  int64_t LayerParameterCount() const;
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

inline int64_t ModelConfig::LayerParameterCount() const {
  const int64_t h = hidden, f = FfnSize(), kv = KvWidth();
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
  return EmbeddingParameterCount() + HeadParameterCount() + layers * LayerParameterCount();
}

}  // namespace pipecheck::reference
