// Pre-flight: what a scenario needs of this machine's memory, from the memory model alone, so a
// row that cannot fit is refused before any rank starts (exit 2) rather than run until the OOM
// killer ends it. Only what is certain is counted: each rank's predicted peak (the memory model
// is exact to a few percent on the CPU), the reference's on rank 0, and the copies rank 0 keeps
// for parity. Not counted: each process's fixed LibTorch overhead, so the figure is a lower
// bound and a refusal is never a false alarm of the model's making.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct MemoryNeed {
  std::string where;          // "host memory" or "cuda:0"
  int64_t needed = 0;         // bytes, at least
  int64_t available = 0;      // bytes the machine offers there
  std::string detail;         // how `needed` adds up
};

// Every place the scenario needs memory (the host for cpu rows; each GPU its ranks use for cuda
// rows), with what it needs and what is there.
std::vector<MemoryNeed> MemoryNeeds(const scenarios::Scenario& scenario);

// "" when the scenario fits; else why not, naming the scenario, the prediction and what is
// available: "scenario 'big' needs at least 1.6 TB of host memory (...), but ...".
std::string MemoryProblem(const scenarios::Scenario& scenario);

// Bytes for people: "512 B", "3.2 MB", "1.6 TB".
std::string HumanBytes(double bytes);

// Host memory this process may still use: MemAvailable, capped by its cgroup's memory.max.
int64_t AvailableHostBytes();

}  // namespace pipecheck::harness
