// `pipecheck run`: every selected scenario through both trainers, one process per rank,
// a progress line as each finishes, a final table, and the reports rewritten after every
// scenario (so an interrupted run still leaves complete, readable reports).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "reports/compare.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct RunOptions {
  std::string scenarios_path;
  std::string out;
  double timeout_seconds = 0.0;  // 0: DefaultDeadlineSeconds of each scenario
  int threads_per_rank = 0;  // 0: the machine's cores shared among a scenario's ranks
  std::string device;        // run-level override of every scenario's device ("" keeps each)
  bool bind_cpus = false;    // LaunchOptions::bind_cpus
  int timed_steps = 0;       // LaunchOptions::timed_steps
  bool timed_steps_given = false;  // LaunchOptions::timed_steps_given
  std::string baseline;      // a baseline summary.csv or its directory to compare with ("" none)
  reports::CompareOptions limits;
  std::string junit;         // JUnit XML file to write ("" none)
  std::string markdown;      // Markdown summary file ("" none; appended when it is $GITHUB_STEP_SUMMARY)
};

// With a baseline, the run is then compared with it as `compare` would (compare.csv in out), and
// a regression fails the run too. Exit code: 0 when every scenario met its expectation (and none
// regressed), 1 otherwise, 128 + signal when
// SIGINT or SIGTERM ended the run (the reports then hold every scenario that finished).
int RunSuite(const std::vector<scenarios::Scenario>& scenarios, const RunOptions& options, std::ostream& out);

}  // namespace pipecheck::harness
