// The plan (harness/plan.h): a scenario resolved once in the parent comes back from its file
// whole (the row, where it came from, the transport, the schedule, the simulation, the memory
// predictions), a file that is not a plan is refused naming it, and the ranks a plan is handed
// to load no suite and build and validate no schedule: each rank's log says how many it did.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "harness/launcher.h"
#include "harness/plan.h"
#include "harness/scenario_model.h"
#include "scenarios/scenario.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kCoreSuite = PIPECHECK_SOURCE_DIR "/scenarios/core.csv";

void ExpectSameSchedule(const pipeline::Schedule& a, const pipeline::Schedule& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.shape.ranks, b.shape.ranks);
  EXPECT_EQ(a.shape.virtual_stages, b.shape.virtual_stages);
  EXPECT_EQ(a.shape.microbatches, b.shape.microbatches);
  EXPECT_EQ(a.shape.placement, b.shape.placement);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) EXPECT_EQ(a.ranks[r], b.ranks[r]) << "rank " << r;
}

// Every row of the default suite: through the file and back, the same plan, down to the bit.
TEST(Plan, ComesBackFromItsFileWhole) {
  std::vector<scenarios::Scenario> rows = harness::LoadSuite(kCoreSuite);
  // Another trainer's rows, whose notes hold commas and quotes, and csv: schedules.
  for (const auto& scenario : harness::LoadSuite(PIPECHECK_SOURCE_DIR "/scenarios/torch-pipelining.csv")) {
    rows.push_back(scenario);
  }
  rows.back().note = "a note, with \"quotes\", and commas";
  for (const auto& scenario : rows) {
    SCOPED_TRACE(scenario.name);
    const auto plan = harness::ResolvePlan(scenario);
    const auto back = harness::PlanFromJson(harness::PlanToJson(plan), "plan.json");
    EXPECT_EQ(scenarios::ToCsv({back.scenario}), scenarios::ToCsv({plan.scenario}));
    EXPECT_EQ(scenarios::Configuration(back.scenario), scenarios::Configuration(plan.scenario));
    EXPECT_EQ(back.scenario.source, plan.scenario.source);
    EXPECT_EQ(back.scenario.note, plan.scenario.note);
    EXPECT_EQ(back.scenario.schedule, plan.scenario.schedule);
    EXPECT_EQ(back.scenario.trainer_path, plan.scenario.trainer_path);
    EXPECT_EQ(back.error, plan.error);
    EXPECT_EQ(scenarios::ValuePlace(back.scenario, "seq_len"), scenarios::ValuePlace(plan.scenario, "seq_len"));
    EXPECT_EQ(back.transport, plan.transport);
    EXPECT_EQ(back.deadline_seconds, plan.deadline_seconds);
    EXPECT_EQ(back.unmet, plan.unmet);
    EXPECT_EQ(back.config.communication, plan.config.communication);
    EXPECT_EQ(back.config.microbatches, plan.config.microbatches);
    ExpectSameSchedule(back.schedule, plan.schedule);
    EXPECT_EQ(back.simulation.makespan, plan.simulation.makespan);
    EXPECT_EQ(back.simulation.bubble, plan.simulation.bubble);
    EXPECT_EQ(back.simulation.start_times, plan.simulation.start_times);
    EXPECT_EQ(back.simulation.peak_in_flight, plan.simulation.peak_in_flight);
    ASSERT_EQ(back.memory.size(), plan.memory.size());
    for (size_t i = 0; i < plan.memory.size(); ++i) {
      EXPECT_EQ(back.memory[i].peak_bytes, plan.memory[i].peak_bytes);
      EXPECT_EQ(back.memory[i].held_after, plan.memory[i].held_after);
      EXPECT_EQ(back.memory[i].peak_during, plan.memory[i].peak_during);
    }
  }
}

// A schedule that cannot run is the plan's error, found before any rank starts: the scenario's
// ERROR row, naming the deadlock.
TEST(Plan, AScheduleThatCannotRunIsItsError) {
  auto scenario = harness::LoadSuite(kCoreSuite).front();
  scenario.world_size = 2;
  scenario.schedule = "1f1b";
  scenario.fault = "send_before_recv";
  const auto plan = harness::ResolvePlan(scenario);
  EXPECT_NE(plan.error.find("deadlock"), std::string::npos) << plan.error;
  EXPECT_TRUE(plan.schedule.ranks.empty());
  const auto report = harness::LaunchScenario(plan, testing::TestLaunchOptions("plan_error"));
  EXPECT_EQ(report.summary.status, reports::Status::kError);
  EXPECT_EQ(report.summary.message, plan.error);
}

TEST(Plan, ASuiteOrBrokenTextIsNotAPlan) {
  EXPECT_THROW(
      {
        try {
          harness::PlanFromJson("name,world_size\nx,2\n", "work/x/plan.json");
        } catch (const scenarios::ScenarioError& error) {
          EXPECT_NE(std::string(error.what()).find("work/x/plan.json: not a plan"), std::string::npos) << error.what();
          throw;
        }
      },
      scenarios::ScenarioError);
  EXPECT_THROW(harness::PlanFromJson("{\"pipecheck_plan\": 1}", "p.json"), scenarios::ScenarioError);
  EXPECT_THROW(harness::PlanFromJson("{\"pipecheck_plan\": 99}", "p.json"), scenarios::ScenarioError);
  EXPECT_THROW(harness::ReadPlan("/nonexistent/plan.json"), scenarios::ScenarioError);
}

// The line each rank prints as it ends: suites loaded, schedules built, validated, simulations run.
struct Counts {
  int rank = -1;
  int suites = -1, built = -1, validated = -1, simulations = -1;
};

Counts CountsIn(const std::string& log) {
  std::ifstream stream(log);
  std::stringstream text;
  text << stream.rdbuf();
  static const std::regex line(
      "pipecheck plan: rank (\\d+): (\\d+) suite\\(s\\) loaded, (\\d+) schedule\\(s\\) built, (\\d+) validated; "
      "(\\d+) simulation\\(s\\) run");
  std::smatch match;
  Counts counts;
  const std::string body = text.str();
  if (!std::regex_search(body, match, line)) return counts;
  counts.rank = std::stoi(match[1]);
  counts.suites = std::stoi(match[2]);
  counts.built = std::stoi(match[3]);
  counts.validated = std::stoi(match[4]);
  counts.simulations = std::stoi(match[5]);
  return counts;
}

// A pipeline of two ranks in two replicas (four processes), with recomputation: every rank reads
// the plan, none loads the suite or builds or validates a schedule, and only rank 0 simulates
// (replaying its measured action times for the step-time prediction, one per timed step).
TEST(Plan, RanksHandedAPlanLoadNoSuiteAndBuildNoSchedule) {
  const auto suite = harness::LoadSuite(kCoreSuite);
  const scenarios::Scenario scenario = scenarios::FindScenario(suite, "recompute_1f1b_dp2_varlen", kCoreSuite);
  const auto plan = harness::ResolvePlan(scenario);
  ASSERT_TRUE(plan.unmet.empty()) << plan.unmet;
  const auto options = testing::TestLaunchOptions("plan_counts");
  const auto report = harness::LaunchScenario(plan, options);
  ASSERT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
  EXPECT_EQ(report.summary.transport, plan.transport);
  const auto directory = std::filesystem::path(options.work_directory) / scenario.name;
  ASSERT_TRUE(std::filesystem::exists(directory / harness::kPlanFile));
  for (int r = 0; r < scenario.Processes(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto counts = CountsIn((directory / ("rank" + std::to_string(r) + ".log")).string());
    ASSERT_EQ(counts.rank, r) << "no 'pipecheck plan:' line in its log";
    EXPECT_EQ(counts.suites, 0);
    EXPECT_EQ(counts.built, 0);
    EXPECT_EQ(counts.validated, 0);
    if (r == 0) {
      EXPECT_LE(counts.simulations, scenario.steps);  // the measured replays alone
    } else {
      EXPECT_EQ(counts.simulations, 0);
    }
  }
}

// A worker that plans itself (torchrun, srun) says so: it loaded the suite and built the schedule.
// The counters are real, so the test above could fail.
TEST(Plan, AWorkerWithoutAPlanLoadsTheSuiteAndBuildsTheSchedule) {
  const auto out = testing::ScratchDirectory("plan_self");
  const std::string command = std::string("RANK=0 WORLD_SIZE=1 ") + PIPECHECK_BINARY +
                              " worker --scenarios " + kCoreSuite + " --scenario ws1_gpipe_llama --timed-steps 0 --out " +
                              out + " > " + out + "/rank0.log 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const auto counts = CountsIn(out + "/rank0.log");
  EXPECT_EQ(counts.suites, 1);
  EXPECT_GE(counts.built, 1);
  EXPECT_GE(counts.validated, 1);
  EXPECT_GE(counts.simulations, counts.validated);
}

}  // namespace
}  // namespace pipecheck
