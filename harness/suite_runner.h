// The suite runner `run` and `invariance` share: scenarios in order, each planned (plan.h) and
// launched with its own deadline and threads, or skipped for an unmet requirement; a line of
// progress while it runs and a line when it ends; a failure to plan or launch is that
// scenario's ERROR row; SIGINT or SIGTERM ends the scenario in flight and the run.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "harness/launcher.h"
#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct SuiteRunOptions {
  LaunchOptions launch;          // executable, work directory, timed steps, worker arguments, binding
  double timeout_seconds = 0.0;  // 0: each plan's deadline
  int threads_per_rank = 0;      // 0: the cores this process may use, shared among a scenario's ranks
};

// One scenario, named `label` in its lines ("[3/25] LABEL ... step 2/4 loss 5.4 (3 s)", then
// "[3/25] LABEL PASS grad_rel ... s"), padded to `width`. Its report's wall_s is how long it took.
// Interrupted propagates.
reports::ScenarioReport RunScenario(const scenarios::Scenario& scenario, const std::string& label,
                                    SuiteRunOptions& options, const std::string& position, size_t width,
                                    std::ostream& out);

struct SuiteRun {
  std::vector<reports::ScenarioReport> reports;  // of the scenarios that finished, in order
  int not_ok = 0;       // how many of them missed their expectation
  int interrupted = 0;  // the signal that ended the run (reports.size() is the one it ended), or 0
};

// Every scenario (`labels[i]` names scenarios[i] in the lines; empty: the scenarios' names), with
// `finished(reports)` called after each (the caller rewrites its reports there). Installs the
// interrupt handlers.
SuiteRun RunScenarios(const std::vector<scenarios::Scenario>& scenarios, const std::vector<std::string>& labels,
                      SuiteRunOptions& options, std::ostream& out,
                      const std::function<void(const std::vector<reports::ScenarioReport>&)>& finished);

// A figure for a progress line or table: `format` applied, "-" when unmeasured, "~0" for
// magnitudes too small to mean anything but zero (which {:.1e} would print with three exponent digits).
std::string Figure(const std::optional<double>& value, const char* format);

// The width of a column holding `names` (at least 8).
size_t NameWidth(const std::vector<std::string>& names);

}  // namespace pipecheck::harness
