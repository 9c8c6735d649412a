// Speed and memory of one scenario, measured beside predicted: the summary's timing, memory and
// bubble columns, ranks.csv and timeline.csv. Predicted memory comes from the memory model
// (pipeline/memory_model.h); predicted step time from the simulator run on each action's
// measured duration, plus each rank's measured time outside its action list (tied sums,
// clipping, optimizer). Measured above predicted is time or memory the schedule does not
// explain: waiting on communication, executor overhead, a buffer held too long.
// Not a judge: nothing here decides PASS or FAIL.
#pragma once

#include <vector>

#include "pipeline/memory_model.h"
#include "pipeline/rank_result.h"
#include "pipeline/simulator.h"
#include "reference/trainer.h"
#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct MeasurementInput {
  const scenarios::Scenario& scenario;
  const std::vector<pipeline::RankResult>& ranks;  // indexed by rank
  const pipeline::Schedule& schedule;              // the lowered schedule the ranks ran
  const pipeline::SimulationResult& simulation;    // its bubble under the unit cost model
  const pipeline::MemoryPrediction& memory;        // empty: not predicted
};

void SpeedAndMemoryRows(const MeasurementInput& input, const reference::TrainResult& reference,
                        reports::ScenarioReport& report);

// Each rank's predicted step time in ms (see the header comment) over the timed steps; empty
// when the ranks' timelines do not fit the schedule.
std::vector<double> PredictStepMs(const pipeline::Schedule& schedule, const std::vector<pipeline::RankResult>& ranks,
                                  size_t steps);

}  // namespace pipecheck::harness
