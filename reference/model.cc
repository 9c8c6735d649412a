// The transformer slice (see model.h).
#include "reference/model.h"

#include <fmt/format.h>

#include "reference/init.h"
#include "reference/linear.h"

namespace pipecheck::reference {

SliceSpec WholeModel(const ModelConfig& config) {
  return SliceSpec{0, config.layers, /*has_embedding=*/true, /*has_head=*/true};
}

TransformerSliceImpl::TransformerSliceImpl(const ModelConfig& config, const SliceSpec& spec)
    : config_(config), spec_(spec) {
  TORCH_CHECK(0 <= spec.first_layer && spec.first_layer <= spec.end_layer &&
                  spec.end_layer <= config.layers,
              "slice layers [", spec.first_layer, ", ", spec.end_layer, ") outside the model's ",
              config.layers, " layers");
  // A tied last stage owns its own copy of the embedding matrix, under the same name.
  if (spec.has_embedding || (spec.has_head && config.tied)) {
    tok_embeddings_ = register_module(
        "tok_embeddings", torch::nn::Embedding(config.vocab, config.hidden));
  }
  if (spec.has_embedding && config.flavor == Flavor::kGpt2) {
    pos_embeddings_ = register_module(
        "pos_embeddings", torch::nn::Embedding(config.max_seq_len, config.hidden));
  }
  // Blocks live under "layers.{global index}" so names survive any partition.
  auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = spec.first_layer; i < spec.end_layer; ++i) {
    blocks_.push_back(layers->register_module(std::to_string(i), TransformerBlock(config, i)));
  }
  if (spec.has_head) {
    norm_ = register_module("norm", Norm(config.flavor, config.hidden));
    if (!config.tied) {
      output_ = register_module(
          "output", torch::nn::Linear(torch::nn::LinearOptions(config.hidden, config.vocab).bias(false)));
    }
  }
}

torch::Tensor TransformerSliceImpl::Embed(const torch::Tensor& tokens) {
  auto x = tok_embeddings_(tokens);  // (B, T, hidden)
  if (pos_embeddings_) {
    const int64_t time = tokens.size(1);
    TORCH_CHECK(time <= config_.max_seq_len, "sequence of ", time,
                " positions exceeds the position table's ", config_.max_seq_len);
    x = x + pos_embeddings_(torch::arange(time, tokens.options()));  // (T, hidden) broadcast
  }
  return x;
}

torch::Tensor TransformerSliceImpl::Head(const torch::Tensor& hidden) {
  auto normed = norm_(hidden);
  return Linear(normed, config_.tied ? tok_embeddings_->weight : output_->weight);  // (B, T, vocab)
}

torch::Tensor TransformerSliceImpl::forward(const torch::Tensor& input, const AttentionContext& context) {
  taps_.clear();
  auto x = spec_.has_embedding ? Embed(input) : input;  // (B, T, hidden)
  Tap(spec_.first_layer, x);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    x = blocks_[i]->forward(x, context);
    Tap(spec_.first_layer + static_cast<int64_t>(i) + 1, x);
  }
  return spec_.has_head ? Head(x) : x;
}

void TransformerSliceImpl::Tap(int64_t layer, const torch::Tensor& hidden) {
  if (!tapped_layers_.count(layer)) return;
  if (hidden.requires_grad()) const_cast<torch::Tensor&>(hidden).retain_grad();
  taps_[layer] = hidden;
}

void TransformerSliceImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("TransformerSlice({}, layers [{}, {}) of {}, hidden={}, heads={}, ffn={}, vocab={}{}{}{})",
                        FlavorName(config_.flavor), spec_.first_layer, spec_.end_layer, config_.layers,
                        config_.hidden, config_.heads, config_.FfnSize(), config_.vocab,
                        spec_.has_embedding ? ", embedding" : "", spec_.has_head ? ", head" : "",
                        config_.tied ? ", tied" : "");
}

TransformerSlice BuildSlice(const ModelConfig& config, const SliceSpec& spec, uint64_t seed,
                            torch::Dtype dtype, torch::Device device) {
  TransformerSlice slice(config, spec);
  slice->to(device, dtype);
  // The only buffers are the MoE layers' expert biases, kept in the router's dtype, not the model's.
  for (auto& buffer : slice->buffers()) buffer.set_data(torch::zeros_like(buffer, RouterDtype(dtype)));
  InitializeParameters(*slice, seed);
  return slice;
}

NamedTensors ExpertBiases(const torch::nn::Module& module) {
  NamedTensors biases;
  for (const auto& item : module.named_buffers()) biases.insert(item.key(), item.value().detach().clone());
  return biases;
}

void SetExpertBiases(torch::nn::Module& module, const NamedTensors& biases) {
  torch::NoGradGuard no_grad;
  auto named = module.named_buffers();
  for (const auto& item : biases) {
    TORCH_CHECK(named.contains(item.key()), "the model holds no expert bias ", item.key());
    named[item.key()].copy_(item.value());
  }
}

void CheckDtypeSupported(torch::Dtype dtype, torch::Device device) {
  try {
    auto options = torch::TensorOptions().dtype(dtype).device(device);
    auto weight = torch::randn({4, 4}, options.requires_grad(true));
    auto input = torch::randn({2, 3, 4}, options);
    auto out = torch::softmax(torch::matmul(torch::silu(input), weight), -1);
    out.to(torch::kFloat32).sum().backward();
  } catch (const c10::Error& error) {
    TORCH_CHECK(false, "dtype ", c10::toString(dtype), " is not supported on ", device.str(),
                " by this LibTorch build: ", error.what_without_backtrace());
  }
}

}  // namespace pipecheck::reference
