// Building blocks of the transformer (see layers.h).
#include "reference/layers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <vector>

#include "reference/device.h"
#include "reference/attention_core.h"
#include "reference/linear.h"
#include "reference/rms_norm.h"

namespace pipecheck::reference {
namespace {

constexpr double kNormEps = 1e-5;
constexpr double kRopeTheta = 10000.0;

// Norm statistics are computed in at least float32, as Hugging Face Llama does for bf16.
torch::Dtype StatisticsDtype(torch::Dtype dtype) {
  return dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

torch::Dtype RouterDtype(torch::Dtype model_dtype) {
  return model_dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::Tensor MovedExpertBias(const torch::Tensor& bias, const torch::Tensor& counts, double gamma) {
  TORCH_CHECK(counts.dim() == 1 && counts.size(0) == bias.size(0), "an expert bias of ", bias.size(0),
              " experts moved by counts of shape ", counts.sizes());
  const auto tokens = counts.to(bias.device(), bias.scalar_type());
  return bias + gamma * torch::sign(tokens.mean() - tokens);
}

namespace {

// A token's experts, ascending, for a message.
std::vector<int64_t> SortedExperts(const torch::Tensor& experts) {
  const auto sorted = std::get<0>(experts.sort()).to(torch::kCPU, torch::kInt64).contiguous();
  return {sorted.data_ptr<int64_t>(), sorted.data_ptr<int64_t>() + sorted.numel()};
}

}  // namespace

int64_t LayerOfName(const std::string& name) {
  static const std::string kPrefix = "layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const auto end = name.find('.', kPrefix.size());
  if (end == std::string::npos || end == kPrefix.size()) return -1;
  int64_t layer = 0;
  for (size_t i = kPrefix.size(); i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    layer = layer * 10 + (name[i] - '0');
  }
  return layer;
}

AttentionContext MakeAttentionContext(const ModelConfig& config, const torch::Tensor& lengths,
                                      int64_t time, torch::Dtype dtype, torch::Device device,
                                      int64_t step_sequences) {
  AttentionContext context;
  auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto positions = torch::arange(time, index_options);                     // (T)
  auto causal = positions.unsqueeze(1) >= positions.unsqueeze(0);          // (T, T) [t, s]
  auto key_valid = positions.unsqueeze(0) < ToDevice(lengths, device).unsqueeze(1);  // (B, T) [b, s]
  context.keep = (causal.unsqueeze(0) & key_valid.unsqueeze(1)).unsqueeze(1);  // (B, 1, T, T)
  if (config.HasExperts()) {
    context.router_dtype = RouterDtype(dtype);
    context.valid = key_valid;
    context.lengths = ToDevice(lengths, device).to(context.router_dtype);
    context.aux_weight = step_sequences > 0 ? config.aux_loss / static_cast<double>(step_sequences) : 0.0;
  }
  if (config.flavor == Flavor::kLlama) {
    // Tables in float64, then cast: the angles are exact to the model's precision.
    const int64_t head_dim = config.HeadDim();
    auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    auto exponents = torch::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
    auto inv_freq = 1.0 / torch::pow(kRopeTheta, exponents);              // (head_dim / 2)
    auto angles = torch::outer(torch::arange(time, f64), inv_freq);        // (T, head_dim / 2)
    auto table = torch::cat({angles, angles}, -1);                         // (T, head_dim)
    // Rounded to the model's dtype on the host, as a blocking .to(device, dtype) did.
    context.cos = ToDevice(table.cos().to(dtype), device);
    context.sin = ToDevice(table.sin().to(dtype), device);
  }
  return context;
}

NormImpl::NormImpl(Flavor flavor, int64_t hidden) : flavor_(flavor), hidden_(hidden) {
  weight_ = register_parameter("weight", torch::ones({hidden}));
  if (flavor_ == Flavor::kGpt2) bias_ = register_parameter("bias", torch::zeros({hidden}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  const auto dtype = x.scalar_type();
  auto stats = x.to(StatisticsDtype(dtype));
  if (flavor_ == Flavor::kLlama) {
    // Under reduced precision the statistics are a float32 copy, and the norm the composite
    // (reference/rms_norm.h says where its one-pass kernel runs).
    auto normed = stats.scalar_type() == dtype ? RmsNormalize(stats, kNormEps) : RmsNormalizeComposite(stats, kNormEps);
    return weight_ * normed.to(dtype);
  }
  auto centred = stats - stats.mean(-1, /*keepdim=*/true);
  auto variance = centred.pow(2).mean(-1, /*keepdim=*/true);  // biased, as LayerNorm
  auto normed = centred * torch::rsqrt(variance + kNormEps);
  return weight_ * normed.to(dtype) + bias_;
}

void NormImpl::pretty_print(std::ostream& stream) const {
  stream << (flavor_ == Flavor::kLlama ? "RMSNorm(" : "LayerNorm(") << hidden_ << ", eps=" << kNormEps
         << ")";
}

AttentionImpl::AttentionImpl(const ModelConfig& config) : config_(config) {
  const bool bias = config.flavor == Flavor::kGpt2;
  wq_ = register_module("wq", MakeLinear(config.hidden, config.hidden, bias));
  wk_ = register_module("wk", MakeLinear(config.hidden, config.KvWidth(), bias));
  wv_ = register_module("wv", MakeLinear(config.hidden, config.KvWidth(), bias));
  wo_ = register_module("wo", MakeLinear(config.hidden, config.hidden, bias));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const AttentionContext& context) {
  const bool llama = config_.flavor == Flavor::kLlama;
  // The projections in this order (their nodes' order is the backward's), then what lies between
  // them and the output projection, one node where it can be (attention_core.h).
  auto q = Linear(wq_, x);
  auto k = Linear(wk_, x);
  auto v = Linear(wv_, x);
  auto mixed = AttentionCore(q, k, v, context.keep, llama ? context.cos : torch::Tensor(),
                             llama ? context.sin : torch::Tensor(), config_.heads, config_.KvHeads());
  return Linear(wo_, mixed);  // (B, T, C)
}

FeedForwardImpl::FeedForwardImpl(const ModelConfig& config) : FeedForwardImpl(config, config.FfnSize()) {}

FeedForwardImpl::FeedForwardImpl(const ModelConfig& config, int64_t ffn) : flavor_(config.flavor) {
  const bool bias = flavor_ == Flavor::kGpt2;
  w1_ = register_module("w1", MakeLinear(config.hidden, ffn, bias));
  w2_ = register_module("w2", MakeLinear(ffn, config.hidden, bias));
  if (flavor_ == Flavor::kLlama) w3_ = register_module("w3", MakeLinear(config.hidden, ffn, false));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  if (flavor_ == Flavor::kLlama) return Linear(w2_, torch::silu(Linear(w1_, x)) * Linear(w3_, x));
  return Linear(w2_, torch::gelu(Linear(w1_, x), "tanh"));
}

MoeFeedForwardImpl::MoeFeedForwardImpl(const ModelConfig& config, int64_t layer) : config_(config), layer_(layer) {
  router_ = register_module("router", MakeLinear(config.hidden, config.experts, false));
  if (config.expert_bias > 0.0) expert_bias_ = register_buffer("expert_bias", torch::zeros({config.experts}));
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
  for (int64_t e = 0; e < config.experts; ++e) {
    experts_.push_back(experts->register_module(std::to_string(e), FeedForward(config, config.ExpertFfnSize())));
  }
  if (config.shared_experts > 0) shared_ = register_module("shared", FeedForward(config, config.ExpertFfnSize()));
}

torch::Tensor MoeFeedForwardImpl::forward(const torch::Tensor& x, const AttentionContext& context) {
  const int64_t batch = x.size(0), time = x.size(1), hidden = x.size(2);
  const int64_t experts = config_.experts, k = config_.top_k;
  const auto router_dtype = context.router_dtype;
  auto flat = x.reshape({batch * time, hidden});  // (N, C)
  auto logits = torch::matmul(flat.to(router_dtype), router_->weight.to(router_dtype).t());  // (N, E)
  const bool softmax = config_.router == Router::kSoftmax;
  auto scores = softmax ? torch::softmax(logits, -1) : torch::sigmoid(logits);  // (N, E)
  // The top k by score (plus the expert bias, which weighs in the choice alone), ties to the lower
  // index: a stable descending sort keeps equal scores in index order (topk promises no order
  // among ties).
  auto choice = expert_bias_.defined() ? scores.detach() + expert_bias_ : scores.detach();
  const bool judged_routing = context.suggested_routing.count(layer_) > 0 || context.choice_jitter > 0.0;
  torch::Tensor scale;  // (N) the logits' rounding scale: max over experts of Σ|w · x|
  if (judged_routing) {
    scale = torch::matmul(flat.detach().to(router_dtype).abs(), router_->weight.detach().to(router_dtype).abs().t())
                .amax(-1);
  }
  if (context.choice_jitter > 0.0) {
    // ± jitter × scale by a fixed pattern over (token, expert): no random state.
    const auto index = torch::arange(choice.numel(), choice.options().dtype(torch::kInt64)).view(choice.sizes());
    const auto sign = (index * 7919 % 13).to(choice.scalar_type()) / 6.0 - 1.0;  // in [-1, 1]
    choice = choice + sign * (context.choice_jitter * scale).unsqueeze(1);
  }
  auto [sorted, order] = choice.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true);
  auto chosen = order.narrow(1, 0, k);
  if (auto found = context.suggested_routing.find(layer_); found != context.suggested_routing.end() && k < experts) {
    // Routing within rounding: where another run chose otherwise, its choice is taken if this
    // token's own choice was decided within the tolerance (its k-th and (k+1)-th choice values
    // closer than tol × the logits' rounding scale; a logit moved by δ moves a score by at most
    // δ/2, so a flip needs a margin under δ), else kept and recorded as a disagreement.
    const auto& suggested = found->second;  // (N, k) int64, -1 rows: none
    TORCH_CHECK(suggested.size(0) == chosen.size(0) && suggested.size(1) == k, "suggested routing of layer ", layer_,
                " has shape ", suggested.sizes(), " for ", chosen.size(0), " tokens and top ", k);
    auto given = suggested.select(1, 0) >= 0;
    if (context.valid.defined()) given = given & context.valid.reshape({-1});
    const auto same = (std::get<0>(chosen.sort(-1)) == std::get<0>(suggested.sort(-1))).all(-1);
    const auto differ = given & ~same;
    if (differ.any().item<bool>()) {
      const auto margin = sorted.select(1, k - 1) - sorted.select(1, k);
      const auto within = margin <= context.routing_tolerance * scale;
      const auto adopt = differ & within, beyond = differ & ~within;
      chosen = torch::where(adopt.unsqueeze(1), suggested, chosen);
      if (context.moe) {
        context.moe->adopted += adopt.sum().item<int64_t>();
        const int64_t disagreements = beyond.sum().item<int64_t>();
        if (disagreements > 0 && context.moe->first_beyond.empty()) {
          const int64_t token = beyond.nonzero()[0][0].item<int64_t>();
          context.moe->first_beyond = fmt::format(
              "layer {}, sequence {}, position {}: chose experts {} where the other run chose {}, with a margin of "
              "{:.3g} between its top {} and the next (the tolerance allows {:.3g})",
              layer_, token / time, token % time, fmt::join(SortedExperts(chosen[token]), ","),
              fmt::join(SortedExperts(suggested[token]), ","), margin[token].item<double>(), k,
              (context.routing_tolerance * scale[token]).item<double>());
        }
        context.moe->beyond += disagreements;
      }
    }
  }
  auto top = scores.gather(1, chosen);                                   // (N, k)
  auto gates = (top / top.sum(-1, /*keepdim=*/true)).to(x.scalar_type());  // (N, k)
  // Dropless dispatch: expert e runs on the tokens that chose it, each output weighted by its gate
  // and added back at its token; an expert no token chose runs nothing (and gets no gradient).
  // Padding positions are routed but not dispatched (their routed output is 0): the loss ignores
  // them, and were they dispatched, an expert chosen only by padding would get a zero gradient in
  // a batch padded further than a microbatch is, and none in the microbatch. An optimizer steps
  // a zero gradient (AdamW's moments and decay) but not a missing one, so which experts have a
  // gradient must depend on the sequences alone, not on how far the split pads them.
  auto slots = chosen.reshape({-1});  // (N·k): slot j is token j / k's (j % k)-th choice
  if (context.valid.defined()) {
    const auto padding = ~context.valid.reshape({-1}).repeat_interleave(k);  // (N·k)
    slots = slots.masked_fill(padding, experts);                              // no expert's index
  }
  auto flat_gates = gates.reshape({-1});
  auto output = torch::zeros_like(flat);
  for (int64_t e = 0; e < experts; ++e) {
    auto where = (slots == e).nonzero().squeeze(1);  // the slots choosing e, ascending
    if (where.numel() == 0) continue;
    auto tokens = torch::div(where, k, "floor");
    auto routed = experts_[e]->forward(flat.index_select(0, tokens)) * flat_gates.index_select(0, where).unsqueeze(1);
    output = output.index_add(0, tokens, routed);
  }
  if (shared_) output = output + shared_->forward(flat);
  if (context.moe) {
    const auto valid = context.valid.reshape({batch * time, 1}).to(router_dtype);  // (N, 1)
    auto picked = torch::zeros({batch * time, experts}, scores.options().requires_grad(false))
                      .scatter_(1, chosen, 1.0) * valid;                             // (N, E)
    auto per_sequence = picked.view({batch, time, experts}).sum(1);                 // (B, E)
    context.moe->chosen[layer_] = chosen.detach();
    auto& counts = context.moe->counts[layer_];
    auto total = per_sequence.sum(0).to(torch::kInt64);
    counts = counts.defined() ? counts + total : total;
    if (config_.aux_loss > 0.0) {
      // Sequence-wise balance loss: f = E / (k · L_s) · (positions of s choosing e), a constant;
      // P = the mean over s's positions of e's normalised score.
      const auto lengths = context.lengths.unsqueeze(1);                               // (B, 1)
      auto fraction = per_sequence * (static_cast<double>(experts) / static_cast<double>(k)) / lengths;
      auto normalised = softmax ? scores : scores / scores.sum(-1, /*keepdim=*/true);
      auto mean_score = (normalised * valid).view({batch, time, experts}).sum(1) / lengths;  // (B, E)
      context.moe->aux_terms.push_back((fraction * mean_score).sum() * context.aux_weight);
    }
  }
  return output.view({batch, time, hidden});
}

TransformerBlockImpl::TransformerBlockImpl(const ModelConfig& config, int64_t layer) {
  attention_norm_ = register_module("attention_norm", Norm(config.flavor, config.hidden));
  attention_ = register_module("attention", Attention(config));
  ffn_norm_ = register_module("ffn_norm", Norm(config.flavor, config.hidden));
  if (config.IsMoeLayer(layer)) {
    moe_ = register_module("feed_forward", MoeFeedForward(config, layer));
  } else {
    feed_forward_ = register_module("feed_forward", FeedForward(config));
  }
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const AttentionContext& context) {
  auto h = x + attention_->forward(attention_norm_->forward(x), context);
  auto normed = ffn_norm_->forward(h);
  return h + (moe_ ? moe_->forward(normed, context) : feed_forward_->forward(normed));
}

}  // namespace pipecheck::reference
