// Can this row run here? Asked of every scenario before any rank starts, answered here alone:
//   - RefusalHere: this build or machine cannot run it at all (no CUDA device, no nccl transport,
//     a trainer's program or Python missing, more memory than the host has by the memory model's
//     prediction). The CLI refuses the suite before anything runs (exit 3; a missing external
//     program is bad input, exit 2).
//   - UnmetRequirement: it could run here, but not in the shape this host has now (nccl with more
//     ranks than GPUs, a framework over NCCL with fewer GPUs than ranks). The row is SKIPPED with
//     the reason, and the rest of the suite runs; the plan carries it (Plan::unmet).
#pragma once

#include <string>

#include "scenarios/scenario.h"

namespace pipecheck::harness {

// Why the scenario cannot run on this build or machine, and where the message points (the row,
// or the column behind a memory refusal: "big.csv:2:3: column 'seq_len', value '65536'"). Both
// empty when it can run.
struct Refusal {
  std::string place, why;
};
Refusal RefusalHere(const scenarios::Scenario& scenario);

// Why this host cannot run the scenario as asked though nothing is wrong with it: the reason for
// a SKIPPED row; empty when it can run.
std::string UnmetRequirement(const scenarios::Scenario& scenario);

}  // namespace pipecheck::harness
