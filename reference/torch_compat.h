// The one place where LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (GPU runners) differ
// for us. Everything else calls these helpers instead of version-specific API.
// Not a general shim: only what pipecheck itself uses.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdint>

namespace pipecheck::compat {

// A CPU generator with a fixed seed; its stream is independent of the global one.
inline at::Generator MakeCpuGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// The integer type of the totals MemoryReportingInfoBase::reportMemoryUsage receives: int64_t
// in 1.13, size_t in 2.x. Deduced from the declaration instead of guessed from version numbers.
template <typename MemberFunction>
struct ThirdParameter;
template <typename Class, typename Result, typename A1, typename A2, typename A3, typename A4, typename A5>
struct ThirdParameter<Result (Class::*)(A1, A2, A3, A4, A5)> {
  using type = A3;
};
using MemoryTotal = ThirdParameter<decltype(&c10::MemoryReportingInfoBase::reportMemoryUsage)>::type;

// What autograd saves for our RMSNorm (x * rsqrt(mean(x^2) + eps), then * weight) when its
// statistics are in the input's own precision (float32, float64): LibTorch 1.13 keeps one more
// (tokens x hidden) tensor than 2.x does. Counted with saved-tensor hooks on both (a llama layer
// in float32: 1.13 keeps 33024 bytes per norm of a 2 x 32 x 64 input, 2.11 keeps 16640). Only
// this case is measured on both; the memory model keeps 1.13's counts elsewhere.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
constexpr int kRmsNormExtraSaved = 0;
#else
constexpr int kRmsNormExtraSaved = 1;
#endif

}  // namespace pipecheck::compat
