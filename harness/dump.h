// `pipecheck dump`: the reference's first step written as files any other implementation can
// check our numbers against (Python's torch.load reads them). Not a checkpoint format.
#pragma once

#include <string>

#include "reference/data.h"
#include "reference/trainer.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// Writes into `directory` (created if missing):
//   weights.pt  name -> initial weight          grads.pt  name -> first step's gradient
//   batch.pt    tokens (B, T), labels (B, T), lengths (B), all int64
//   loss.pt     loss -> 0-dim first-step loss   scenario.csv  the scenario at effective values
// Gradients are before clipping and before any optimizer step.
void DumpReference(const scenarios::Scenario& scenario, const std::string& directory);

// The files those are made of, which torch.load reads (written atomically): name -> tensor (on
// the CPU), and a batch as {tokens, labels, lengths}. The external-trainer protocol hands a
// trainer its weights and batches in the same files.
void SaveTensors(const reference::NamedTensors& tensors, const std::string& path);
void SaveBatch(const reference::Batch& batch, const std::string& path);

}  // namespace pipecheck::harness
