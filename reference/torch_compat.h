// The one place where LibTorch versions differ for us (pipecheck builds against 2.x; the pinned
// version is in requirements.txt). Everything else calls these helpers instead of
// version-specific API. Not a general shim: only what pipecheck itself uses.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace pipecheck::compat {

// A CPU generator with a fixed seed; its stream is independent of the global one.
inline at::Generator MakeCpuGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// The integer type of the totals MemoryReportingInfoBase::reportMemoryUsage receives (size_t in
// 2.x, int64_t before). Deduced from the declaration instead of guessed from version numbers.
template <typename MemberFunction>
struct ThirdParameter;
template <typename Class, typename Result, typename A1, typename A2, typename A3, typename A4, typename A5>
struct ThirdParameter<Result (Class::*)(A1, A2, A3, A4, A5)> {
  using type = A3;
};
using MemoryTotal = ThirdParameter<decltype(&c10::MemoryReportingInfoBase::reportMemoryUsage)>::type;

}  // namespace pipecheck::compat
