// Stop, reshard, resume (scenario column `resume`): a scenario run as stretches, one per layout.
// Stretch i runs its layout's ranks from the step the previous stretch stopped after to the next
// resume (or the last step); each but the last writes a checkpoint, each but the first loads the
// previous one's. Every stretch is judged as a whole run is, from its first step, by a judge that
// carries on where the previous stretch's judge stopped (parity.h), and the stretches' reports
// make the row's one report: its steps, timeline and messages marked with the layout that ran them.
#pragma once

#include <string>
#include <vector>

#include "harness/plan.h"
#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// One stretch: the scenario at its layout (steps = the step it stops after) and its segment,
// whose paths lie under `folder` (the scenario's work directory).
struct Stretch {
  scenarios::Scenario scenario;
  Segment segment;
};
std::vector<Stretch> StretchesOf(const scenarios::Scenario& scenario, const std::string& folder);

// The row's report from the stretches' (in order; fewer than the stretches where one could not
// run on): the scenario's own columns, the worst status, the first failing stretch's message (or
// the last's), the largest errors and peaks, the last stretch's speed (the others take no
// timing-only steps); the rows of every stretch,
// each marked with its layout (ranks.csv: the last layout's).
reports::ScenarioReport MergeStretches(const scenarios::Scenario& scenario, const std::vector<Stretch>& stretches,
                                       const std::vector<reports::ScenarioReport>& reports);

}  // namespace pipecheck::harness
