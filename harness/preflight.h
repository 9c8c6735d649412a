// Pre-flight: what a scenario needs of this machine's memory, from the memory model alone, so a
// row that cannot fit is refused before any rank starts rather than run until the OOM killer
// ends it. Only what is certain is counted: each process's fixed overhead (measured), each
// rank's predicted peak (the memory model is exact to a few percent on the CPU), the
// reference's on rank 0, and the copies rank 0 keeps for parity. The figure is a lower bound, so
// a refusal is never a false alarm of the model's making.
//
// Bounded whatever the sizes: nothing of the model or its data is made (the batch's shapes come
// from its lengths alone); a floor computed in floating point (the reference's parameters and
// whole-batch activations, the processes, the copies) refuses first, so the exact model's
// integer sums never overflow; and the exact model walks at most kSizingActions actions, fewer
// steps than the row's when needed (still a lower bound), or is left out for the floor alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct MemoryNeed {
  std::string where;          // "host memory" or "cuda:0"
  double needed = 0;          // bytes, at least (a double: an absurd row's figure cannot overflow)
  int64_t available = 0;      // bytes the machine offers there
  std::string detail;         // how `needed` adds up
  std::string column;         // the row's column behind the largest part of it (seq_len, world_size, ...)
};

// Every place the scenario needs memory (the host for cpu rows; each GPU its ranks use for cuda
// rows), with what it needs and what is there.
std::vector<MemoryNeed> MemoryNeeds(const scenarios::Scenario& scenario);

// "" when the scenario fits; else why not, naming the scenario, the prediction and what is
// available: "scenario 'big' needs at least 1.6 TB of host memory (...), but ...".
std::string MemoryProblem(const scenarios::Scenario& scenario);

// The same with where it points: the column behind the largest part of the need (ValuePlace).
struct MemoryRefusal {
  std::string place;  // "big.csv:2:3: column 'seq_len', value '65536'"
  std::string why;    // MemoryProblem's text; "" when the scenario fits
};
MemoryRefusal MemoryRefusalOf(const scenarios::Scenario& scenario);

// What each process of a run holds before any tensor of its model (LibTorch's own state, the
// transport, the records): a floor measured on a pipecheck worker (anonymous resident memory at
// its start: 270 and 288 MB for the two ranks of a 2-layer, hidden-16 row; the launcher 207 MB;
// LibTorch 2.15 on Debian 12). A Python trainer's processes hold more.
constexpr int64_t kProcessOverheadBytes = 250'000'000;

// The most actions (summed over a replica's ranks and the steps walked) the exact model walks
// for a pre-flight check, which keeps validating any row well under a second.
constexpr int64_t kSizingActions = 200'000;

// The most actions the schedule's lowering may simulate for a pre-flight or load-time check
// (LowerScheduleWithin): past it the check is left to the ranks, which lower it in full.
constexpr int64_t kLoweringBudget = 250'000;

// Bytes for people: "512 B", "3.2 MB", "1.6 TB".
std::string HumanBytes(double bytes);

// Host memory this process may still use: MemAvailable, capped by its cgroup's memory.max.
int64_t AvailableHostBytes();

}  // namespace pipecheck::harness
