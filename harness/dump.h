// `pipecheck dump`: the reference's first step written as files any other implementation can
// check our numbers against (Python's torch.load reads them). Not a checkpoint format.
#pragma once

#include <string>

#include "scenarios/scenario.h"

namespace pipecheck::harness {

// Writes into `directory` (created if missing):
//   weights.pt  name -> initial weight          grads.pt  name -> first step's gradient
//   batch.pt    tokens (B, T), labels (B, T), lengths (B), all int64
//   loss.pt     loss -> 0-dim first-step loss   scenario.csv  the scenario at effective values
// Gradients are before clipping and before any optimizer step.
void DumpReference(const scenarios::Scenario& scenario, const std::string& directory);

}  // namespace pipecheck::harness
