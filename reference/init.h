// Deterministic per-parameter initialisation: every parameter is drawn from its own
// generator seeded by (scenario seed, global parameter name), so a pipeline stage builds
// exactly its slice of the model with no full model in memory.
// Not an optimiser-aware or fan-in-scaled scheme: docs/design.md §2 fixes N(0, 0.02).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace pipecheck::reference {

// 64-bit seed for one named stream: stable across platforms and LibTorch versions.
uint64_t StreamSeed(uint64_t seed, const std::string& name, uint64_t index = 0);

// The initial value of parameter `name` with `shape`, in float64 on the CPU:
// norm weights 1, biases 0, everything else N(0, 0.02) from its own generator.
torch::Tensor InitialValue(uint64_t seed, const std::string& name, torch::IntArrayRef shape);

// Overwrites every parameter of `module` (names as `named_parameters()` gives them, which
// are the global names for our modules) with its InitialValue, cast to its dtype/device.
void InitializeParameters(torch::nn::Module& module, uint64_t seed);

}  // namespace pipecheck::reference
