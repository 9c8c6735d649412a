// Test helpers (see test_support.h).
#include "tests/test_support.h"

#include "harness/run_directory.h"

#include <unistd.h>

#include <filesystem>

namespace pipecheck::testing {

std::string ScratchDirectory(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pipecheck_test_" + name + "_" + std::to_string(getpid()));
  harness::RemoveTree(path.string());
  std::filesystem::create_directories(path);
  return path.string();
}

harness::LaunchOptions TestLaunchOptions(const std::string& suite, const std::string& name, double timeout_seconds) {
  harness::LaunchOptions options;
  options.executable = PIPECHECK_BINARY;
  options.scenarios_path = suite;
  options.work_directory = ScratchDirectory(name);
  options.timeout_seconds = timeout_seconds;
  options.threads_per_rank = 1;
  return options;
}

std::string ScenariosCsv(const std::vector<scenarios::Scenario>& scenarios) { return scenarios::ToCsv(scenarios); }

}  // namespace pipecheck::testing
