// A scenario resolved for this host, once: the device, dtype and transport its ranks use, the
// pipeline configuration, the lowered and validated schedule with its simulation, each
// replica's memory prediction, the deadline, and why the row cannot run here if it cannot.
//
// `pipecheck run` and `invariance` resolve a plan in the parent and hand it to every rank as a
// file (`worker --plan`); a worker started by torchrun or srun resolves it once itself from the
// suite. Rank 0 judges with the same plan, and the summary's transport is the plan's: what ran,
// not what a later process would work out again. A worker handed a plan loads no suite and
// builds no schedule (SimulationsRun and SuitesLoaded stay at zero; a test counts them).
#pragma once

#include <string>
#include <vector>

#include "pipeline/memory_model.h"
#include "pipeline/simulator.h"
#include "pipeline/trainer.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// One layout's stretch of a scenario that stops and resumes (scenario column `resume`): its
// steps run from first_step to the scenario's `steps`, starting from load_checkpoint (none for
// the first) and writing save_checkpoint (none for the last). The judge of each stretch carries
// the previous one's on (parity.h): it reads judge_state_in and writes judge_state_out.
struct Segment {
  int index = 0;  // 0: the row's own layout; i: the layout after its i-th resume
  int count = 1;
  int64_t first_step = 0;
  std::string load_checkpoint, save_checkpoint;
  std::string judge_state_in, judge_state_out;
};

struct Plan {
  scenarios::Scenario scenario;  // as loaded, a run-level --device already applied
  // "none" (world size 1), "gloo", "staged" or "nccl"; "" for another trainer, which picks its own.
  std::string transport;
  // The scenario's configuration for `transport` (ToPipelineConfig); per-rank settings (flight
  // record, replica, device index, timed steps) are the worker's to add. Derived, not stored.
  pipeline::PipelineConfig config;
  // The lowered, validated schedule every rank runs. For another trainer: pipecheck's own schedule
  // of the same layout, for its shape (where stages sit) alone.
  pipeline::Schedule schedule;
  pipeline::SimulationResult simulation;  // under unit costs; empty for another trainer
  // What each replica's ranks should hold (memory_model.h), by replica; empty for another trainer.
  std::vector<pipeline::MemoryPrediction> memory;
  double deadline_seconds = 0;  // DefaultDeadlineSeconds
  std::string unmet;  // why this host cannot run the row as asked (a SKIPPED row); "" when it can
  // Why the schedule cannot run (a deadlock the loader left unchecked, a fault that breaks the
  // lowering): the scenario's ERROR, found before any rank starts; "" when it can.
  std::string error;
  Segment segment;  // the whole run, unless the scenario resumes
};

// The plan's configuration with its segment's first step and checkpoints.
void ApplySegment(Plan& plan);

// Resolves `scenario` on this host. A row whose requirement is unmet gets `unmet`, and one whose
// schedule cannot run gets `error`; neither has a schedule (their ranks never start).
Plan ResolvePlan(const scenarios::Scenario& scenario);

// A plan as text (JSON) and back; the text holds the scenario as a one-row suite plus where the
// row came from, so messages still point into the suite (`core.csv:7:3`). Reading throws
// ScenarioError naming `file` for text that is not a plan.
std::string PlanToJson(const Plan& plan);
Plan PlanFromJson(const std::string& text, const std::string& file);
void WritePlan(const Plan& plan, const std::string& path);
Plan ReadPlan(const std::string& path);

}  // namespace pipecheck::harness
