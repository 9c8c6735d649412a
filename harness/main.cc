// The `pipecheck` command line: one subcommand per file in harness/cli/, over the harness library.
// Exit codes follow docs/design.md §5: 0 all good, 1 something did not meet its expectation, 2 bad
// input, 3 a row this machine cannot run.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "harness/cli/commands.h"
#include "harness/errors.h"
#include "harness/fork_server.h"
#include "harness/run_directory.h"
#include "pipeline/schedule.h"
#include "reference/host_memory.h"
#include "reference/linear.h"
#include "reports/compare.h"
#include "scenarios/scenario.h"

namespace pipecheck::cli {
namespace {

// Runs `command`, turning what it throws into the exit codes of docs/design.md §5.
int RunCommand(const Command& command) {
  try {
    return command.run();
  } catch (const scenarios::ScenarioError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const reports::CompareError& error) {
    fmt::print(stderr, "pipecheck {}: {}\n", command.label, error.what());
  } catch (const harness::RunDirectoryError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const pipeline::ScheduleError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const std::filesystem::filesystem_error& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck: {}\n", harness::ErrorMessage(error));
    return 1;
  }
  return kExitBadInput;
}

// The command line, dispatched: what main runs, and what each rank the fork server starts runs
// with the argv an exec would have given it.
int Dispatch(int argc, char** argv) {
  CLI::App app{"pipecheck: verifies a pipeline-parallel trainer against a single-device reference"};
  app.require_subcommand(1);
  // Counted only when asked: counting initialises the CUDA driver, which no rank needs before it runs.
  app.set_version_flag("--version", std::function<std::string()>([] {
    std::string gemm;
    try {
      gemm = reference::CpuGemmName();
    } catch (const std::exception& error) {
      gemm = error.what();
    }
    return fmt::format("pipecheck {} (LibTorch {}.{}.{}, CPU float32 linear: {}, CUDA devices: {})", PIPECHECK_VERSION,
                       TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, gemm, torch::cuda::device_count());
  }));
  const std::vector<Command> commands = {AddValidate(app),   AddReference(app), AddDump(app),
                                         AddRun(app),        AddWorker(app),    AddInvariance(app),
                                         AddSchedule(app),   AddCompare(app),   AddBaselineUpdate(app)};
  // A word that names no command is a typo to name, not a missing subcommand.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      fmt::print(stderr, "pipecheck: unknown command '{}'; the commands are {} (pipecheck --help)\n", argv[1],
                 fmt::join(names, ", "));
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitBadInput;
  }
  try {
    reference::CpuGemmName();  // a bad PIPECHECK_CPU_GEMM is the command line's error, not each rank's
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
    return kExitBadInput;
  }
  for (const auto& command : commands) {
    if (command.app->parsed()) return RunCommand(command);
  }
  return kExitBadInput;
}

}  // namespace
}  // namespace pipecheck::cli

int main(int argc, char** argv) {
  pipecheck::reference::KeepFreedHostMemory();  // before anything is allocated: every command may train and time
  // The commands that start ranks fork their server now, while this process has no thread, no
  // CUDA context and no OpenMP pool for a rank to inherit (harness/fork_server.h).
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "run" || command == "invariance") pipecheck::harness::StartForkServer(pipecheck::cli::Dispatch);
  const int code = pipecheck::cli::Dispatch(argc, argv);
  pipecheck::harness::StopForkServer();
  // A rank has written and closed everything it hands over; LibTorch's static destructors would
  // only deregister every operator again (0.19 s a process on 2 cores, more than a tiny scenario's training).
  if (command == "worker") pipecheck::harness::EndRank(code);
  return code;
}
