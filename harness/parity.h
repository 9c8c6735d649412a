// Parity: the pipeline's results held against the reference's, producing one scenario's report
// rows and its verdict. Small judges, each looking at one thing, in the order evidence appears:
//  1. initial weights: every rank starts from the reference's initial weights, exactly;
//  2. each step k, at the pipeline's own weights (oracle.h): the loss and every parameter's
//     gradient against the reference's at those same weights, and the weights after the step
//     against one reference optimizer step applying the gradients the pipeline applied. These
//     measure one step's arithmetic, so they hold at any step count and any learning rate;
//     bfloat16 rows of pipecheck's trainer (CPU and CUDA) also hold every gradient against the
//     reference summing the same microbatches in float32 (EvaluateAccumulatedAt), at 4e-4: sums
//     kept in bfloat16 stay inside bfloat16's whole-batch tolerance but not there;
//  3. the free-running trajectory (losses every step, final weights): within `tol`, or else
//     within kEnvelopeFactor x the measured rounding envelope (oracle.h), so long or lively runs
//     whose rounding grows through the optimizer are not false alarms, while a wrong trajectory
//     still fails;
//  4. a reference that diverges (non-finite or exploded loss or gradient norm) is an ERROR, not
//     a parity verdict.
// Gradient error = ||g_pp - g_ref|| / max(||g_ref||, floor), floor = DtypeOf(dtype).floor_fraction
// x the whole model's gradient norm: relative where a gradient is real, absolute where it is zero
// analytically (a key projection's bias) and holds only rounding noise. The floor depends on the
// dtype alone, never on `tol`, so a loose tolerance cannot make real gradients look like noise.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/oracle.h"
#include "harness/plan.h"
#include "pipeline/memory_model.h"
#include "pipeline/simulator.h"
#include "pipeline/trainer.h"
#include "reports/report.h"
#include "scenarios/dtypes.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// A free-running trajectory may differ from the reference's by this many times the measured
// rounding envelope (see parity.h's header comment; docs/design.md §2 says how it is measured).
constexpr double kEnvelopeFactor = 10.0;

// The reference has diverged when its loss exceeds this many times ln(vocab), the loss of a
// uniform prediction: logits that large mean training exploded.
constexpr double kDivergedLossFactor = 100.0;

// Everything measured for one scenario.
struct ParityInput {
  const scenarios::Scenario& scenario;
  Oracle& oracle;
  // Indexed by rank; with several replicas, replica by replica (each indexed by pipeline rank).
  const std::vector<pipeline::RankResult>& ranks;
  const pipeline::Schedule& schedule;              // the lowered schedule the ranks ran
  const pipeline::SimulationResult& simulation;    // its predicted bubble
  const pipeline::MemoryPrediction& memory;        // what each rank should hold (empty: not predicted)
  // The messages each rank posted against the schedule's plan: pipecheck's own trainer only
  // (another trainer's messages are its own business, and it records none).
  bool check_communication = true;
  // The pipeline configuration the judges read the stages' layers, microbatches and dtype from;
  // null: the scenario's own (ToPipelineConfig). Another trainer's scenario passes its view
  // without the fault, which is that trainer's to inject.
  const pipeline::PipelineConfig* pipeline_config = nullptr;
  // With several replicas (data_parallel), each replica's prediction, by replica (its shard's
  // sequences differ); null: `memory` for every replica.
  const std::vector<pipeline::MemoryPrediction>* replica_memory = nullptr;
  // What the ranks ran over (the plan's transport), for the summary; none: what they would run over
  // on this host (ResolveTransport).
  std::optional<std::string> transport = std::nullopt;
  // A stretch of a run that stops and resumes (plan.h): judged from its first step, its load
  // judged at the resume (every tensor each rank loaded against the checkpoint, bitwise), the
  // judge carrying on from the previous stretch's judge state; null: the whole run.
  const Segment* segment = nullptr;
};

reports::ScenarioReport CompareWithReference(const ParityInput& input);

// The summary row of a scenario that produced no results (ERROR, TIMEOUT): every column
// known from the scenario filled, the measurements empty.
// `transport` as ParityInput's.
reports::ScenarioReport FailedScenarioReport(const scenarios::Scenario& scenario, reports::Status status,
                                             const std::string& message,
                                             const std::optional<std::string>& transport = std::nullopt);

}  // namespace pipecheck::harness
