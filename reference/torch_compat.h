// The one place where LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (GPU runners) differ
// for us. Everything else calls these helpers instead of version-specific API.
// Not a general shim: only what pipecheck itself uses.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdint>

namespace pipecheck::compat {

constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// A CPU generator with a fixed seed; its stream is independent of the global one.
inline at::Generator MakeCpuGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

}  // namespace pipecheck::compat
