// The one place where LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (GPU runners) differ
// for us. Everything else calls these helpers instead of version-specific API.
// Not a general shim: only what pipecheck itself uses.
#pragma once

#include <torch/types.h>
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

// What autograd saves for our norms (RMSNorm and LayerNorm, written out in reference/layers.cc):
// LibTorch 1.13 keeps one (tokens x hidden) statistics-precision tensor more per norm than 2.x.
// Counted with saved-tensor hooks on both (bytes kept, input 2 x 32 x 64, 1.13 -> 2.11): RMSNorm
// float32 33024 -> 16640, bfloat16 41216 -> 24832; LayerNorm float32 49408 -> 33024. On a GPU
// (LibTorch 2.11) a gpt2 bfloat16 stage's measured peak matched one tensor less per norm to 0.2%.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
constexpr int kNormExtraSaved = 0;
#else
constexpr int kNormExtraSaved = 1;
#endif

}  // namespace pipecheck::compat
