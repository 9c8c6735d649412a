// Parity: the pipeline's results held against the reference's, step by step and parameter by
// parameter, producing one scenario's report rows and its verdict.
//
// Error of a parameter's gradient = ||g_pp - g_ref|| / max(||g_ref||, floor), with
// floor = FloorFraction(tol) x ||g_ref|| over the whole model: relative where a gradient is
// real, absolute on the floor where it is zero analytically and holds only rounding noise (a
// key projection's bias: softmax ignores a constant added to a row). A parameter whose
// reference gradient is at or under the floor at every step is "numerically zero": its
// gradients are still checked every step, but its final weights are not, since AdamW turns
// gradient noise into updates of up to lr per step on both sides. Final weights of every
// other parameter follow the same rule as gradients.
#pragma once

#include <vector>

#include "pipeline/simulator.h"
#include "pipeline/trainer.h"
#include "reference/trainer.h"
#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// The floor, as a fraction of the whole model's gradient (or weight) norm.
inline double FloorFraction(double tol) { return tol / 10 > 1e-6 ? tol / 10 : 1e-6; }

// Everything measured for one scenario.
struct ParityInput {
  const scenarios::Scenario& scenario;
  const reference::TrainResult& reference;
  const std::vector<pipeline::RankResult>& ranks;  // indexed by rank
  const pipeline::SimulationResult& simulation;    // the schedule's predicted bubble
};

reports::ScenarioReport CompareWithReference(const ParityInput& input);

// The summary row of a scenario that produced no results (ERROR, TIMEOUT): every column
// known from the scenario filled, the measurements empty.
reports::ScenarioReport FailedScenarioReport(const scenarios::Scenario& scenario, const std::string& status,
                                             const std::string& message);

// Whether `status` meets `expect` ("pass": PASS; "fail": FAIL, ERROR or TIMEOUT).
bool MeetsExpectation(const std::string& status, const std::string& expect);

}  // namespace pipecheck::harness
