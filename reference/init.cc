// Per-name seeded initialisation (see init.h).
#include "reference/init.h"

#include <torch/utils.h>

#include "reference/torch_compat.h"

namespace pipecheck::reference {
namespace {

constexpr double kWeightStd = 0.02;

// SplitMix64 finaliser: spreads nearby inputs (seed 1 vs 2) over the whole 64-bit space.
uint64_t Mix(uint64_t value) {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

// FNV-1a over the name's bytes: fixed by definition, unlike std::hash.
uint64_t HashName(const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

uint64_t StreamSeed(uint64_t seed, const std::string& name, uint64_t index) {
  return Mix(Mix(Mix(seed) ^ HashName(name)) ^ index);
}

torch::Tensor InitialValue(uint64_t seed, const std::string& name, torch::IntArrayRef shape) {
  auto options = torch::TensorOptions().dtype(torch::kFloat64);
  // Norm weights are the scale of RMSNorm/LayerNorm: attention_norm, ffn_norm, norm.
  if (EndsWith(name, "norm.weight")) return torch::ones(shape, options);
  if (EndsWith(name, ".bias")) return torch::zeros(shape, options);
  auto generator = compat::MakeCpuGenerator(StreamSeed(seed, name));
  return torch::empty(shape, options).normal_(0.0, kWeightStd, generator);
}

void InitializeParameters(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    auto& parameter = item.value();
    parameter.copy_(InitialValue(seed, item.key(), parameter.sizes()));
  }
}

}  // namespace pipecheck::reference
