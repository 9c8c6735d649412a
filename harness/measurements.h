// Speed and memory of one scenario, measured beside predicted: the summary's timing, memory and
// bubble columns, ranks.csv and timeline.csv. Predicted memory comes from the memory model
// (pipeline/memory_model.h); predicted step time from the simulator run on each step's
// measured action durations, plus each rank's measured time outside its action list (tied sums,
// clipping, optimizer). Measured above predicted is time or memory the schedule does not
// explain: waiting on communication, executor overhead, a buffer held too long.
// Not a judge: nothing here decides PASS or FAIL.
#pragma once

#include <optional>
#include <string>
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
  // Indexed by rank; with several replicas, replica by replica. The timeline, the bubble and the
  // predicted step time are replica 0's (every replica runs the same list); ranks.csv and the
  // peaks cover every replica.
  const std::vector<pipeline::RankResult>& ranks;
  const pipeline::Schedule& schedule;              // the lowered schedule the ranks ran
  const pipeline::SimulationResult& simulation;    // its bubble under the unit cost model
  const pipeline::MemoryPrediction& memory;        // empty: not predicted
  // Each replica's prediction where there are several (data_parallel); null: `memory` for all.
  const std::vector<pipeline::MemoryPrediction>* replica_memory = nullptr;
};

void SpeedAndMemoryRows(const MeasurementInput& input, const reference::TrainResult& reference,
                        reports::ScenarioReport& report);

// An executed action as a timeline.csv row: the one place a row is made, from a rank's record of
// a finished step (with the memory model's figures for it) or from a flight record (a failed run's
// partial timeline, whose entries carry no step clock: `step_clock` false). Times rounded to µs.
reports::TimelineRow TimelineRowOf(const std::string& scenario, int64_t rank, const pipeline::ActionTiming& action,
                                   bool step_clock, std::optional<int64_t> held_predicted = std::nullopt,
                                   std::optional<int64_t> peak_predicted = std::nullopt);

// Step time predicted from the measured action costs, in ms. Each timed step is simulated on its
// own actions' durations (plus each rank's time after its last action), and the medians are
// taken over those simulated steps, the way the measured columns take them over measured steps.
// Not the simulation of each action's median duration: which actions run slow changes from step
// to step (ranks sharing cores, a shared host), and a path through per-action medians is
// shorter than any step's real critical path (on scenarios/cpu-large.csv's 4-rank scenarios on
// 2 cores, 13-32% shorter than measured).
struct StepPrediction {
  std::vector<double> rank_ms;  // per rank: the median of its simulated step times
  double step_ms = 0.0;         // the median of each simulated step's slowest rank
  bool ok() const { return !rank_ms.empty(); }
};

// Empty (not ok) when the ranks' timelines do not fit the schedule: a timed step with another
// number of actions than a rank's list, or one the simulator cannot run.
StepPrediction PredictStepMs(const pipeline::Schedule& schedule, const std::vector<pipeline::RankResult>& ranks,
                             size_t steps);

}  // namespace pipecheck::harness
