// The dtype table (see dtypes.h).
#include "scenarios/dtypes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace pipecheck::scenarios {

const std::vector<DtypeTraits>& Dtypes() {
  static const std::vector<DtypeTraits> table = {
      // name       bytes default_tol max_tol floor  reduced bitwise_on_cpu
      {"float64", 8, 1e-9, 1e-6, 1e-5, false, true},
      {"float32", 4, 1e-4, 1e-3, 1e-3, false, false},
      {"bfloat16", 2, 3e-2, 5e-2, 3e-3, true, false},
  };
  return table;
}

std::vector<std::string> DtypeNames() {
  std::vector<std::string> names;
  for (const auto& traits : Dtypes()) names.push_back(traits.name);
  return names;
}

const DtypeTraits& DtypeOf(const std::string& name) {
  for (const auto& traits : Dtypes()) {
    if (traits.name == name) return traits;
  }
  throw std::invalid_argument(fmt::format("unknown dtype '{}' ({})", name, fmt::join(DtypeNames(), ", ")));
}

}  // namespace pipecheck::scenarios
