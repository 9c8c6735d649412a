// No false alarms: every row of the core suite, over 50 seeds, passes through real ranks.
// Label "long" (make test-long).
// One test per seed, each running all rows.
#include <gtest/gtest.h>

#include <fstream>

#include "harness/launcher.h"
#include "scenarios/scenario.h"
#include "harness/scenario_model.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

class CoreSuiteSeed : public ::testing::TestWithParam<int> {};

TEST_P(CoreSuiteSeed, EveryRowPasses) {
  const uint64_t seed = 1000 + 7919 * static_cast<uint64_t>(GetParam());
  auto suite = harness::LoadSuite(PIPECHECK_SOURCE_DIR "/scenarios/core.csv");
  const std::string directory = testing::ScratchDirectory("seed" + std::to_string(GetParam()));
  const std::string path = directory + "/core_seed.csv";
  for (auto& scenario : suite) scenario.seed = seed;
  std::ofstream(path) << testing::ScenariosCsv(suite);
  const auto options = testing::TestLaunchOptions("seed_work" + std::to_string(GetParam()));
  for (const auto& scenario : harness::LoadSuite(path)) {
    const auto report = harness::LaunchScenario(scenario, options);
    EXPECT_EQ(report.summary.status, reports::Status::kPass) << scenario.name << " seed " << seed << ": " << report.summary.message;
  }
}

INSTANTIATE_TEST_SUITE_P(FiftySeeds, CoreSuiteSeed, ::testing::Range(0, 50));

}  // namespace
}  // namespace pipecheck
