// One executed action, the one form every record of it takes: a rank's record of a finished step
// (RankResult::timeline), a flight record's entry read back (TimingOf), and from either the
// timeline.csv row (harness/measurements.h: TimelineRowOf).
#pragma once

#include <cstdint>

#include "pipeline/schedule.h"

namespace pipecheck::pipeline {

// One action as executed: for timelines and measured bubbles.
struct ActionTiming {
  int64_t step = 0;
  Action action;
  double start_us = 0.0;  // since the step started
  double end_us = 0.0;
  int64_t held_bytes = -1;  // tensor bytes the trainer held right after the action; -1 unmetered
  int64_t peak_bytes = -1;  // the most it held from the action's start (its wait included) to its end
  double wait_start_us = 0.0;  // since the step started: when it began waiting for its input (= start_us: no wait)
  double step_start_us = 0.0;  // when the step started, on the run's clock (see Executor::SetClockOrigin)
};

}  // namespace pipecheck::pipeline
