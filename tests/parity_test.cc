// Multi-process parity: every row of tests/data/parity.csv runs as real ranks (one process
// each, Gloo over loopback) against the real reference, through the same launcher as
// `pipecheck run`, and must PASS at its dtype's default tolerance.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "harness/launcher.h"
#include "scenarios/scenario.h"
#include "harness/scenario_model.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kSuite = PIPECHECK_SOURCE_DIR "/tests/data/parity.csv";

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  for (const auto& scenario : harness::LoadSuite(kSuite)) names.push_back(scenario.name);
  return names;
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, PipelineMatchesReference) {
  const auto suite = harness::LoadSuite(kSuite);
  const scenarios::Scenario scenario = scenarios::FindScenario(suite, GetParam(), kSuite);
  const auto report = harness::LaunchScenario(scenario, testing::TestLaunchOptions("parity_" + scenario.name));
  EXPECT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
  EXPECT_EQ(report.summary.ok, true);
  EXPECT_LE(report.summary.grad_max_rel_err.value_or(1.0), scenario.tol);
  EXPECT_LE(report.summary.weights_max_rel_err.value_or(1.0), scenario.tol);
  EXPECT_EQ(report.steps.size(), static_cast<size_t>(scenario.steps));
  EXPECT_FALSE(report.params.empty());
}

INSTANTIATE_TEST_SUITE_P(Scenarios, Parity, ::testing::ValuesIn(ScenarioNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pipecheck

namespace pipecheck {
namespace {

// The schedule's memory promise, measured on real ranks: GPipe keeps every microbatch's
// activations on the first rank, 1F1B at most `ranks` of them.
TEST(ScheduleMemory, OneFOneBFirstRankPeaksBelowGPipe) {
  const std::string csv = testing::ScratchDirectory("schedule_memory") + "/memory.csv";
  std::ofstream(csv) << "name,layers,hidden,heads,world_size,schedule,batch,microbatches,seq_len,steps\n"
                        "gpipe,4,64,4,4,gpipe,16,16,32,2\n"
                        "onefoneb,4,64,4,4,1f1b,16,16,32,2\n";
  const auto suite = harness::LoadSuite(csv);
  const auto options = testing::TestLaunchOptions("schedule_memory_work");
  std::map<std::string, int64_t> first_rank_peak;
  for (const auto& scenario : suite) {
    const auto report = harness::LaunchScenario(scenario, options);
    ASSERT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
    ASSERT_EQ(report.ranks.size(), 4u);
    first_rank_peak[scenario.name] = report.ranks[0].peak_bytes.value_or(-1);
  }
  EXPECT_LT(first_rank_peak["onefoneb"], first_rank_peak["gpipe"]);
}

}  // namespace
}  // namespace pipecheck
