// Runs one scenario as real processes: `world_size` copies of our own binary in worker mode,
// with the torchrun environment, rendezvousing on a free loopback port. A scenario has a
// deadline; a rank that crashes fails the scenario (ERROR, naming the rank, how it ended and
// its last lines of output), a rank that hangs fails it too (TIMEOUT), and every other rank
// of that scenario is killed and reaped. Not a cluster scheduler: one machine, loopback only.
#pragma once

#include <string>

#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct LaunchOptions {
  std::string executable;      // the pipecheck binary
  std::string scenarios_path;  // the suite the workers load the scenario from
  std::string work_directory;  // each scenario gets work_directory/NAME for logs and results
  double timeout_seconds = 300.0;
  int threads_per_rank = 1;
};

reports::ScenarioReport LaunchScenario(const scenarios::Scenario& scenario, const LaunchOptions& options);

// The absolute path of the running executable.
std::string CurrentExecutable();

}  // namespace pipecheck::harness
