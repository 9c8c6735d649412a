// No false alarms on long and lively runs: every row of scenarios/long.csv (20+ steps, lr up to
// 1e-2, float32 and bfloat16, AdamW and SGD) passes through real ranks, where a fixed tolerance
// on the free-running trajectory used to fail correct pipelines. Label "long".
#include <gtest/gtest.h>

#include <cctype>

#include "harness/launcher.h"
#include "scenarios/scenario.h"
#include "harness/scenario_model.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kLongSuite = PIPECHECK_SOURCE_DIR "/scenarios/long.csv";

class LongRun : public ::testing::TestWithParam<std::string> {};

TEST_P(LongRun, CorrectPipelinePasses) {
  const auto suite = harness::LoadSuite(kLongSuite);
  const scenarios::Scenario scenario = scenarios::FindScenario(suite, GetParam(), kLongSuite);
  const auto report = harness::LaunchScenario(scenario, testing::TestLaunchOptions("long_" + GetParam(), 900));
  EXPECT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
}

std::vector<std::string> LongScenarios() {
  std::vector<std::string> names;
  for (const auto& scenario : harness::LoadSuite(kLongSuite)) names.push_back(scenario.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(LongSuite, LongRun, ::testing::ValuesIn(LongScenarios()),
                         [](const auto& info) {
                           std::string name = info.param;  // GoogleTest names: letters, digits, '_'
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace pipecheck
