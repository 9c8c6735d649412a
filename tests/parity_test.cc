// Multi-process parity: every row of tests/data/parity.csv runs as real ranks (one process
// each, Gloo over loopback) against the real reference, through the same launcher as
// `pipecheck run`, and must PASS at its dtype's default tolerance.
#include <gtest/gtest.h>

#include "harness/launcher.h"
#include "scenarios/scenario.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kSuite = PIPECHECK_SOURCE_DIR "/tests/data/parity.csv";

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  for (const auto& scenario : scenarios::LoadScenarios(kSuite)) names.push_back(scenario.name);
  return names;
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, PipelineMatchesReference) {
  const auto suite = scenarios::LoadScenarios(kSuite);
  const auto& scenario = scenarios::FindScenario(suite, GetParam(), kSuite);
  harness::LaunchOptions options;
  options.executable = PIPECHECK_BINARY;
  options.scenarios_path = kSuite;
  options.work_directory = testing::ScratchDirectory("parity_" + scenario.name);
  options.timeout_seconds = 120;
  options.threads_per_rank = 1;
  const auto report = harness::LaunchScenario(scenario, options);
  EXPECT_EQ(report.Get("status"), "PASS") << report.Get("message");
  EXPECT_EQ(report.Get("ok"), "1");
  EXPECT_LE(std::stod(report.Get("grad_max_rel_err")), scenario.tol);
  EXPECT_LE(std::stod(report.Get("weights_max_rel_err")), scenario.tol);
  EXPECT_EQ(report.steps.size(), static_cast<size_t>(scenario.steps));
  EXPECT_FALSE(report.params.empty());
}

INSTANTIATE_TEST_SUITE_P(Scenarios, Parity, ::testing::ValuesIn(ScenarioNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pipecheck
