// Runs one scenario as real processes: `world_size` copies of our own binary in worker mode,
// with the torchrun environment, rendezvousing on a free loopback port. A scenario has a
// deadline; a rank that crashes fails the scenario (ERROR, naming the rank, how it ended and
// its last lines of output), a rank that hangs fails it too (TIMEOUT), and every other rank
// of that scenario is killed and reaped. Not a cluster scheduler: one machine, loopback only.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "harness/plan.h"
#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct LaunchOptions {
  std::string executable;      // the pipecheck binary
  std::string work_directory;  // each scenario gets work_directory/NAME for logs, its plan and results
  // A stretch of a scenario that resumes (plan.h's Segment) gets work_directory/NAME/subdirectory.
  std::string subdirectory;
  double timeout_seconds = 300.0;
  int threads_per_rank = 1;
  int port = 0;  // rendezvous port; 0 lets the kernel pick a free one
  // Timed steps each rank takes for tokens/s's spread (worker --timed-steps): timing-only steps
  // after the judged ones make up the difference; 0 none (parity alone).
  int timed_steps = 0;
  // Whether timed_steps was asked for (run --timed-steps): then it holds for every row, else a
  // row's own timed_steps column does, where it has one.
  bool timed_steps_given = false;
  std::vector<std::string> worker_args;  // further arguments for every rank's worker command
  // Called about every progress_seconds while a scenario runs, with the latest progress line of
  // its ranks ("step 3/24 loss 5.41"); none when empty.
  std::function<void(const std::string&)> progress;
  double progress_seconds = 5.0;
  // CPU scenarios: each rank bound to its own share of the CPUs this process may use
  // (CpusOfRank), so that ranks neither wander between cores nor crowd onto one while another
  // idles. Off by default: two runs side by side (ctest -j) would bind their ranks to the same
  // shares. CUDA ranks stay unbound: their best cores depend on where their GPU sits.
  bool bind_cpus = false;
};

// Deadlines follow progress, not the wall clock. A scenario is ended as hung once its deadline has
// passed and none of its processes made progress (used CPU time, finished an action, wrote a
// line) for the stall window: min(kStallSeconds, deadline / 2). One that is still progressing
// runs on, up to kDeadlineCap times its deadline: slow under load is not hung.
constexpr double kStallSeconds = 10.0;
constexpr double kDeadlineCap = 10.0;
enum class DeadlineVerdict { kRunning, kStalled, kOverCap };
DeadlineVerdict JudgeDeadline(double elapsed_seconds, double since_progress_seconds, double deadline_seconds);

// The CPU seconds (user + system) process `pid` has used so far; nullopt when it cannot be read.
std::optional<double> CpuSeconds(pid_t pid);

// The CPUs rank `rank` of `ranks` on one host is bound to: a contiguous share of `allowed`, in
// its order, shares differing by at most one CPU; all of `allowed` when it holds fewer CPUs than
// there are ranks (they share cores whatever is done, and binding would only stop the kernel
// from balancing them).
std::vector<int> CpusOfRank(const std::vector<int>& allowed, int rank, int ranks);

// The CPUs this process may run on (its affinity mask), ascending; empty when it cannot be read.
std::vector<int> AllowedCpus();

// The cores this process may use: its affinity mask's CPUs, fewer under a cgroup CPU quota
// (containers, CI runners); at least 1.
int UsableCores();

// Thrown when SIGINT or SIGTERM arrived (see InstallInterruptHandlers) while a scenario ran:
// its ranks have been killed and reaped.
struct Interrupted {
  int signal;
};

// Makes SIGINT and SIGTERM end the scenario in flight (its ranks killed) instead of the process.
void InstallInterruptHandlers();

// Writes the plan into the scenario's work directory (kPlanFile) and starts its workers on it.
reports::ScenarioReport LaunchScenario(const Plan& plan, const LaunchOptions& options);

// The same for a scenario resolved here (ResolvePlan), as tests launch one; a scenario that
// resumes through LaunchResumed, with the options' timeout and threads.
reports::ScenarioReport LaunchScenario(const scenarios::Scenario& scenario, const LaunchOptions& options);

// A scenario that stops and resumes (resume.h): each layout's stretch planned and launched in
// turn under work_directory/NAME/layoutI, the next only after one that ran to its end (passing
// or failing: its checkpoint is written either way); their reports merged into the row's.
// `timeout_seconds` 0: each stretch's plan's deadline; `threads_per_rank` 0: the usable cores
// shared among each stretch's processes.
reports::ScenarioReport LaunchResumed(const scenarios::Scenario& scenario, const LaunchOptions& options,
                                      double timeout_seconds, int threads_per_rank);

// The plan's file in a scenario's work directory.
constexpr const char* kPlanFile = "plan.json";

// A deadline sized to the scenario: 30 s plus three times its steps' arithmetic at a
// pessimistic 1 GFLOP/s, so a healthy run never meets it and a hung one is found in minutes.
double DefaultDeadlineSeconds(const scenarios::Scenario& scenario);

// How messages name process `process` of a scenario's run: "rank 3", or with several replicas
// "rank 3 (replica 1 rank 1)" (process g is replica g / world_size's rank g mod world_size).
std::string ProcessName(const scenarios::Scenario& scenario, int process);

// The absolute path of the running executable.
std::string CurrentExecutable();

}  // namespace pipecheck::harness
