// Proving the verifier: every injected fault of scenarios/faults.csv is caught with a message
// that says what went wrong, the same scenario without its fault passes, no process outlives
// a scenario, and every schedule and fault name is written once. (The launcher: launcher_test.cc.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "harness/launcher.h"
#include "pipeline/faults.h"
#include "scenarios/scenario.h"
#include "harness/scenario_model.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kFaultSuite = PIPECHECK_SOURCE_DIR "/scenarios/faults.csv";

// Processes whose parent is this test process (none may outlive a scenario).
int ChildProcesses() {
  int children = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string pid, comm, state;
    int parent = 0;
    if (stat >> pid >> comm >> state >> parent && parent == getpid()) ++children;
  }
  return children;
}

// What each fault's message must say.

// The registry entry of `fault`: what its message must say (caught_as), or what sees a fault that
// parity passes by design (seen_by: `pipecheck invariance` sees reversed_accumulation,
// tests/invariance_test.cc; a baseline comparison sees slow_steps, tests/ci_outputs_test.py).
const pipeline::FaultInfo& EntryOf(const std::string& fault) {
  for (const auto& entry : pipeline::FaultRegistry()) {
    if (entry.name == fault) return entry;
  }
  throw std::invalid_argument("no fault " + fault);
}

std::vector<std::string> FaultScenarios() {
  std::vector<std::string> names;
  for (const auto& scenario : harness::LoadSuite(kFaultSuite)) names.push_back(scenario.name);
  return names;
}

class Fault : public ::testing::TestWithParam<std::string> {};

TEST_P(Fault, IsCaughtAndItsControlPasses) {
  const auto suite = harness::LoadSuite(kFaultSuite);
  auto scenario = scenarios::FindScenario(suite, GetParam(), kFaultSuite);
  const auto options = testing::TestLaunchOptions(GetParam(), scenario.fault == "hang_rank" ? 8 : 60);
  const auto caught = harness::LaunchScenario(scenario, options);
  EXPECT_NE(caught.summary.status, reports::Status::kPass);
  EXPECT_EQ(caught.summary.ok, true);
  const auto& expected = EntryOf(scenario.fault).caught_as;
  ASSERT_FALSE(expected.empty()) << scenario.fault << " passes parity by design: it does not belong in faults.csv";
  EXPECT_TRUE(std::regex_search(caught.summary.message, std::regex(expected)))
      << scenario.fault << ": " << caught.summary.message;
  EXPECT_EQ(ChildProcesses(), 0) << "a worker outlived its scenario";
  if (scenario.fault == "crash_rank" || scenario.fault == "hang_rank" || scenario.fault == "killed_rank" ||
      scenario.fault == "rank_exits_early") {
    // The partial timeline, from the ranks' flight records, reaches into the step that failed
    // (step 1, half-way through the last rank's list).
    ASSERT_FALSE(caught.timeline.empty()) << scenario.fault;
    EXPECT_TRUE(std::any_of(caught.timeline.begin(), caught.timeline.end(), [](const auto& row) { return row.step == 1; }))
        << scenario.fault;
  }

  // The control: the same scenario without the fault passes.
  scenario.fault = "none";
  scenario.expect = "pass";
  const std::string control_suite = options.work_directory + "/control.csv";
  std::ofstream(control_suite) << testing::ScenariosCsv({scenario});
  const auto control =
      harness::LaunchScenario(scenario, testing::TestLaunchOptions(GetParam() + "_control"));
  EXPECT_EQ(control.summary.status, reports::Status::kPass) << control.summary.message;
}

INSTANTIATE_TEST_SUITE_P(Suite, Fault, ::testing::ValuesIn(FaultScenarios()),
                         [](const auto& info) { return info.param; });

TEST(Faults, EveryFaultHasAScenarioAndTheLoaderKnowsEveryName) {
  std::set<std::string> covered;
  for (const auto& scenario : harness::LoadSuite(kFaultSuite)) covered.insert(scenario.fault);
  const auto& names = pipeline::FaultNames();
  for (size_t i = 1; i < names.size(); ++i) {
    const auto& entry = EntryOf(names[i]);
    EXPECT_NE(entry.caught_as.empty(), entry.seen_by.empty()) << names[i] << ": a message it is caught with, or what sees it";
    if (entry.caught_as.empty()) {
      EXPECT_FALSE(covered.count(names[i])) << names[i] << " passes parity: it does not belong in faults.csv";
      EXPECT_NO_THROW(harness::ParseSuite("name,fault\nx," + names[i] + "\n", "f.csv")) << names[i];
      continue;
    }
    EXPECT_TRUE(covered.count(names[i])) << names[i] << " has no scenario in faults.csv";
    EXPECT_NO_THROW(std::regex(entry.caught_as)) << names[i];
    EXPECT_NO_THROW(harness::ParseSuite("name,fault\nx," + names[i] + "\n", "f.csv")) << names[i];
  }
  EXPECT_THROW(harness::ParseSuite("name,fault\nx,typo\n", "f.csv"), scenarios::ScenarioError);
}

// Schedule and fault names are written once, in pipeline/; the loader takes them from there.
TEST(Names, LoaderGeneratorsAndFaultsAgreeOnEveryName) {
  const auto& vocabulary = harness::PipelineVocabulary();
  EXPECT_EQ(vocabulary.schedules, pipeline::ScheduleNames());
  EXPECT_EQ(vocabulary.faults, pipeline::FaultNames());
  for (const auto& name : pipeline::ScheduleNames()) {
    EXPECT_NO_THROW(pipeline::MakeSchedule(name, {2, name == "interleaved" ? 2 : 1, 4})) << name;
    const std::string virtual_stages = name == "interleaved" ? "2" : "";  // else the schedule's own
    EXPECT_EQ(harness::ParseSuite("name,schedule,virtual_stages\nx," + name + "," + virtual_stages + "\n", "s.csv")[0].schedule,
              name);
  }
  EXPECT_THROW(harness::ParseSuite("name,schedule\nx,zigzag\n", "s.csv"), scenarios::ScenarioError);
  const auto& faults = pipeline::FaultNames();
  for (size_t i = 0; i < faults.size(); ++i) {
    EXPECT_EQ(pipeline::ParseFault(faults[i]), faults[i]);
    EXPECT_EQ(pipeline::FaultRegistry()[i].name, faults[i]);
    EXPECT_FALSE(pipeline::FaultRegistry()[i].summary.empty()) << faults[i];
    EXPECT_EQ(harness::ParseSuite("name,fault\nx," + faults[i] + "\n", "f.csv")[0].fault, faults[i]);
  }
  EXPECT_EQ(faults.front(), "none");
  EXPECT_THROW(pipeline::ParseFault("typo"), std::invalid_argument);
}

}  // namespace
}  // namespace pipecheck
