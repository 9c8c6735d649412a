// What each rank did when, to look at: a Chrome trace (trace.json: loads in Perfetto and
// chrome://tracing) and an SVG picture (timeline.svg: any browser), both made from a scenario's
// executed timeline (timeline.csv's rows). Ranks are on one clock: steps are timed from the
// moment rank 0 left the barrier every rank passes before training (PipelineTrainer::AlignClocks).
#pragma once

#include <string>
#include <vector>

#include "reports/report.h"

namespace pipecheck::reports {

// One process (the scenario), one track per rank; every executed action is a complete event
// ("ph": "X") named like the schedule writes it (`3F2`, `1SEND_B0`), with its step, stage,
// microbatch and held bytes as args; every wait for a message before an action is its own event
// (category "wait"); each step's start is an instant event on rank 0's track.
std::string ChromeTrace(const ScenarioReport& report);

// Ranks as rows, time across: F, B, I, W, communication and waits in distinct colours, idle
// time left blank (the bubbles), dashed lines where each step starts, a legend and a time axis.
// Every action is a <rect> with data-rank, data-step and data-action attributes and a <title>.
std::string TimelineSvg(const ScenarioReport& report);

// Writes DIRECTORY/views/SCENARIO/trace.json and .../timeline.svg for a scenario that has a
// timeline (nothing otherwise); returns the paths written.
std::vector<std::string> WriteTimelineViews(const std::string& directory, const ScenarioReport& report);

}  // namespace pipecheck::reports
