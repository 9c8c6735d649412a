// Test helpers (see test_support.h).
#include "tests/test_support.h"

#include "harness/run_directory.h"

#include <unistd.h>

#include <filesystem>

namespace pipecheck::testing {

reports::ScenarioReport SummaryRow(const std::string& name, const std::string& status, const std::string& expect,
                                   double tokens_per_s, double peak_bytes, double grad_rel_err) {
  reports::ScenarioReport report;
  auto& row = report.summary;
  row.scenario = name;
  row.status = reports::ParseStatus(status);
  row.expect = expect;
  row.ok = (expect == "pass") == (status == "PASS");
  row.pp_tokens_per_s = tokens_per_s;
  row.pp_peak_bytes_max = static_cast<int64_t>(peak_bytes);
  row.grad_max_rel_err = grad_rel_err;
  // A baseline measured its noise: three runs within 1% of each other.
  row.pp_tokens_per_s_spread = 0.01;
  row.pp_tokens_per_s_runs = 3;
  row.message = "a, \"quoted\" message";
  return report;
}

std::string ScratchDirectory(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pipecheck_test_" + name + "_" + std::to_string(getpid()));
  harness::RemoveTree(path.string());
  std::filesystem::create_directories(path);
  return path.string();
}

harness::LaunchOptions TestLaunchOptions(const std::string& name, double timeout_seconds) {
  harness::LaunchOptions options;
  options.executable = PIPECHECK_BINARY;
  options.work_directory = ScratchDirectory(name);
  options.timeout_seconds = timeout_seconds;
  options.threads_per_rank = 1;
  options.timed_steps = 0;  // parity alone: no timing-only steps
  return options;
}

std::string ScenariosCsv(const std::vector<scenarios::Scenario>& scenarios) { return scenarios::ToCsv(scenarios); }

}  // namespace pipecheck::testing
