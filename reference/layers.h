// The transformer's building blocks, shared by the reference and the pipeline stages:
// norms, rotary attention, MLPs and the pre-norm block, for both flavours.
// Blocks hold parameters under their docs/design.md §2 local names (wq, w1, attention_norm, …);
// the global prefix `layers.{i}.` comes from where the owner registers them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "reference/model_config.h"

namespace pipecheck::reference {

// What one forward's mixture-of-experts layers leave behind, for the trainer that ran it.
struct MoeRecord {
  // Each MoE layer's balance-loss term (0-dim, in the router's dtype, with its graph), in the
  // order the layers ran; absent where aux_loss is 0.
  std::vector<torch::Tensor> aux_terms;
  // By global layer index: tokens routed to each expert (E) int64, padding positions excluded.
  std::map<int64_t, torch::Tensor> counts;
  // By global layer index: each token's chosen experts (N, k) int64, detached, as dispatched.
  std::map<int64_t, torch::Tensor> chosen;
  // Against AttentionContext::suggested_routing: valid tokens whose own choice differed and whose
  // k-th/(k+1)-th margin was within the routing tolerance (the suggestion taken), and those whose
  // margin was not (their own kept), with the first such one described.
  int64_t adopted = 0;
  int64_t beyond = 0;
  std::string first_beyond;

  // The sum of aux_terms, in the order the layers ran, with its graph; undefined when none.
  torch::Tensor BalanceLoss() const {
    torch::Tensor sum;
    for (const auto& term : aux_terms) sum = sum.defined() ? sum + term : term;
    return sum;
  }
};

// What every layer of one forward pass shares: built once per (micro)batch.
struct AttentionContext {
  torch::Tensor keep;  // (B, 1, T, T) bool: query t may attend key s (causal, s not padding)
  torch::Tensor cos;   // (T, head_dim) llama rotary tables in the model dtype; undefined for gpt2
  torch::Tensor sin;   // (T, head_dim)
  // Mixture of experts only (undefined, 0 and null otherwise).
  torch::Tensor valid;    // (B, T) bool: the position lies within its sequence's length
  torch::Tensor lengths;  // (B) each sequence's length, in the router's dtype
  torch::Dtype router_dtype = torch::kFloat32;  // RouterDtype of the model's dtype
  double aux_weight = 0.0;  // aux_loss / sequences of the whole step's batch (every replica's)
  std::shared_ptr<MoeRecord> moe;  // where the MoE layers record; null records nothing
  // Routing within rounding (a judge's reference only): by layer, the (B·T, k) choices another
  // run of the same tokens made (rows of -1: none). A valid token whose own choice differs takes
  // the suggested one where its k-th and (k+1)-th choice values lie within
  // routing_tolerance × max over experts of Σ|router weight · input| (the logits' rounding scale),
  // and is recorded in MoeRecord either way.
  std::map<int64_t, torch::Tensor> suggested_routing;
  double routing_tolerance = 0.0;
  // A perturbation of the choice values alone, ± this × the token's rounding scale (fault
  // router_choice_rounding): flips only choices decided within it, as another kernel's rounding
  // would. 0: none.
  double choice_jitter = 0.0;
};

// lengths: (B) int64 valid tokens per sequence; the batch is padded to `time` positions.
// `step_sequences`: the sequences of the whole step's batch over every replica, the balance
// loss's 1/B (a microbatch's terms are its own sequences' share of the step's objective).
AttentionContext MakeAttentionContext(const ModelConfig& config, const torch::Tensor& lengths,
                                      int64_t time, torch::Dtype dtype, torch::Device device,
                                      int64_t step_sequences = 0);

// The router's dtype: float64 for float64 models, else float32.
torch::Dtype RouterDtype(torch::Dtype model_dtype);

// Auxiliary-loss-free balancing: an MoE layer's bias (E) after a step whose whole batch routed
// `counts` (E, int64: every microbatch once, every replica, padding excluded) tokens to each
// expert: bias + γ · sign(mean count − count), in the bias's dtype. An expert routed fewer tokens
// than the mean is favoured next step, one routed more is held back.
torch::Tensor MovedExpertBias(const torch::Tensor& bias, const torch::Tensor& counts, double gamma);

// The global layer index in a buffer or parameter name `layers.{i}.…`; -1 for any other name.
int64_t LayerOfName(const std::string& name);

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
  FeedForwardImpl(const ModelConfig& config, int64_t ffn);  // another width (an expert's)
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Flavor flavor_;
  torch::nn::Linear w1_{nullptr}, w2_{nullptr}, w3_{nullptr};
};
TORCH_MODULE(FeedForward);

// A mixture-of-experts feed-forward (llama): a router (E, hidden) in float32 (float64 for
// float64 models) scores each token over E experts (softmax, or each logit's sigmoid), the token
// takes its top_k (ties to the lower index), the chosen scores renormalised over the k are its
// gates; output = Σ gate · expert(x) (+ shared(x)). Dropless: each expert runs on exactly the
// tokens that chose it, so the routing and every token's output never depend on the batch split.
// With a context's MoeRecord it records its sequence-wise balance-loss term and its counts.
// With expert_bias γ > 0 it holds the buffer `expert_bias` (E, in the router's dtype, zeros at
// start), added to the scores for the choice of the top k only (auxiliary-loss-free balancing);
// its trainer moves it after each step (MovedExpertBias).
class MoeFeedForwardImpl : public torch::nn::Module {
 public:
  MoeFeedForwardImpl(const ModelConfig& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const AttentionContext& context);

 private:
  ModelConfig config_;
  int64_t layer_;
  torch::Tensor expert_bias_;  // expert_bias > 0 only
  torch::nn::Linear router_{nullptr};
  std::vector<FeedForward> experts_;
  FeedForward shared_{nullptr};
};
TORCH_MODULE(MoeFeedForward);

// h = x + Attn(Norm(x)); y = h + MLP(Norm(h)), the MLP dense or a mixture of experts.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const ModelConfig& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const AttentionContext& context);

 private:
  Norm attention_norm_{nullptr};
  Attention attention_{nullptr};
  Norm ffn_norm_{nullptr};
  FeedForward feed_forward_{nullptr};
  MoeFeedForward moe_{nullptr};  // instead of feed_forward_ in an MoE layer
};
TORCH_MODULE(TransformerBlock);

}  // namespace pipecheck::reference
