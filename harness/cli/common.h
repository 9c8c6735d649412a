// What pipecheck's subcommands share: exit codes, defaults, option validators and option groups,
// and the checks each makes before any work (files it will write, rows this machine cannot run,
// a baseline it would overwrite). One subcommand per file beside this one (commands.h).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reports/compare.h"
#include "scenarios/scenario.h"

namespace pipecheck::cli {

// Exit codes (docs/design.md §5): 0 all good, 1 something did not meet its expectation.
constexpr int kExitBadInput = 2;
// A well-formed suite with a row this build or machine cannot run (no CUDA device or nccl, too
// little memory): not the suite's fault, so CI can tell it from a typo.
constexpr int kExitCannotRunHere = 3;
constexpr const char* kDefaultSuite = "scenarios/core.csv";
constexpr const char* kDefaultOut = "reports/latest";

// One subcommand: its parser, what it is called in messages, and what runs when it is parsed.
struct Command {
  CLI::App* app = nullptr;
  std::string label;
  std::function<int()> run;
};

// ---- Validators: one message for every way a value is wrong ("value 'TEXT' is not allowed: expected ALLOWED").
CLI::Validator FiniteIn(double min, double max, const std::string& allowed);  // finite, in [min, max]
CLI::Validator WholeIn(int64_t min, int64_t max, const std::string& allowed);
// A comma-separated list of whole numbers from min to max into `values`; an empty or bad entry is
// refused naming it.
CLI::Option* AddWholeList(CLI::App* command, const std::string& name, std::vector<int64_t>& values, int64_t min,
                          int64_t max, const std::string& what, const std::string& help);
CLI::Validator ThreadCount();  // 0 (automatic) up to this machine's cores

// ---- Checks made before any work; each prints why it fails, naming the command.
bool WritableOut(const std::string& out, const char* command);
// Whether path `inner` is `outer` or lies inside it (both resolved as far as they exist).
bool Within(const std::string& inner, const std::string& outer);
// Whether `out` would be written inside the baselines' directory or the baseline compared with,
// or over them: refused, naming both.
bool WritesOverABaseline(const std::string& out, const std::string& baseline_dir, const std::string& baseline,
                         const char* command, const char* what);
bool WritableFile(const std::string& path, const char* command, const char* option);
// A device=cuda scenario on a build or machine without CUDA, said before anything runs.
bool CudaPresentFor(const scenarios::Scenario& scenario, const char* command);
// What `run` refuses before any rank starts, said the same way by `validate` and `run --list`
// (harness/runnable.h's RefusalHere): a trainer program the suite names that is not there is bad
// input (exit 2); else every scenario this machine cannot run, each on its own line (exit 3);
// 0 when all can run. `cannot`, if given, receives how many cannot.
int CheckRunnableHere(const std::vector<scenarios::Scenario>& scenarios, const char* command, int* cannot = nullptr);

void ApplyThreads(int threads);  // intra-op threads (0: LibTorch's default), one inter-op thread

// ---- Option groups several subcommands share.
CLI::Option* AddScenarios(CLI::App* command, std::string& scenarios);
void AddOnly(CLI::App* command, std::vector<std::string>& only);
void AddThreads(CLI::App* command, int& threads, const char* help);
CLI::Option* AddDevice(CLI::App* command, std::string& device, const char* help);
void AddTimeout(CLI::App* command, double& timeout, const char* help);

// Which baseline a run or comparison is held to, and how far it may fall behind.
struct GateOptions {
  std::string baseline_dir = "reports/baselines";
  std::string runner;
  double max_slowdown = 0.10;
  double max_memory_growth = 0.10;
  double noise_factor = reports::CompareOptions{}.noise_factor;

  reports::CompareOptions Limits() const {
    reports::CompareOptions limits;
    limits.max_slowdown = max_slowdown;
    limits.max_memory_growth = max_memory_growth;
    limits.noise_factor = noise_factor;
    return limits;
  }
};

// With `optional` (run), the limits apply only with --runner, and their help says so.
void AddGate(CLI::App* command, GateOptions& gate, const std::string& runner_help, bool optional);
// The CI files a command may also write: JUnit XML and a Markdown summary.
void AddCiFiles(CLI::App* command, std::string& junit, std::string& markdown, const char* junit_help);
bool CiFilesWritable(const std::string& junit, const std::string& markdown, const char* command);
// The baseline a command compares with: --baseline-dir/--runner, else the one given; a missing or
// unreadable one is bad input (reports::CompareError), found before anything runs.
std::string ResolveBaseline(const GateOptions& gate, const std::string& given);
// The suite's scenarios that --only selects, each on --device if given; none is bad input.
std::vector<scenarios::Scenario> SelectedScenarios(const std::string& path, const std::vector<std::string>& only,
                                                   const std::string& device);

}  // namespace pipecheck::cli
