// `pipecheck reference`: the reference trainer alone over a suite, printing each step's loss
// and the median step time. Useful on its own (a baseline of the oracle's numbers) and the
// default `make run` until the pipeline harness lands.
#pragma once

#include <ostream>
#include <vector>

#include "scenarios/scenario.h"

namespace pipecheck::harness {

// Returns the exit code: 0 when every scenario trained to finite losses, 1 otherwise.
// `microbatched`: each scenario's batch as its microbatches one after another, gradients
// accumulated (TrainConfig::microbatches), instead of in one piece. `phases`: each scenario's
// step split by phase (TrainConfig::phase_times), printed below its line as
// "  phases_ms PHASE=MS ..." (medians over the timed steps).
struct ReferenceRunOptions {
  bool microbatched = false;
  bool phases = false;
};
int RunReferenceSuite(const std::vector<scenarios::Scenario>& scenarios, const ReferenceRunOptions& options,
                      std::ostream& out);

}  // namespace pipecheck::harness
