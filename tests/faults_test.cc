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
const std::map<std::string, std::string> kExpectedMessage = {
    // Where the fault shows at a stage boundary, the first wrong boundary tensor comes first.
    {"detach_input", "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err 1 > tol"},
    {"mean_of_microbatch_means", "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err .* against the reference cut"},
    {"grad_scale_per_microbatch", "^gradient of tok_embeddings.weight at step 0 on rank 0 \\(stage 0\\): rel err"},
    {"zero_grad_per_microbatch", "^gradient of tok_embeddings.weight at step 0 on rank 0 \\(stage 0\\): rel err"},
    {"drop_microbatch", "^step 0, microbatch 3: gradient into stage 0 \\(from rank 1\\) rel err 1 > tol"},
    {"local_clip", "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err"},
    {"tied_norm_twice", "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err"},
    {"skip_tied_sync", "^communication, step 0: rank [02]'s message #[0-9]+ is a missing message: it posted nothing, where the plan has receive the tied weight's gradient"},
    {"stale_shape", "^rank 1 exited with code 1; its last output: pipecheck worker rank 1: The size of tensor"},
    {"optimizer_state_reset", "^update of .* at step 1 on rank [01] \\(stage [01]\\): rel err .* against one reference optimizer step"},
    {"clip_before_tied_sync", "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err"},
    {"double_grad_scaling", "^gradient of tok_embeddings.weight at step 0 on rank 0 \\(stage 0\\): rel err"},
    {"send_buffer_reuse", "^step 0, microbatch [0-9]+: activation into stage 1 changed between rank 0's send and rank 1's receive"},
    {"zb_shared_weight_grad_twice", "^gradient of tok_embeddings.weight at step 0 on rank [01] \\(stage [01]\\): rel err"},
    {"swap_boundary_shapes", "message from rank [01] \\(the .* for stage [0-9]+, microbatch [0-9]+\\) is .* but the plan expects"},
    {"duplicate_send", "^communication, step 0: rank 0's message #[0-9]+ is an extra message: it posted send the activation for stage 1, microbatch 0 to rank 1"},
    {"send_before_recv", "invalid when sends wait for receives: deadlock"},
    {"crash_rank", "^rank 2 was killed by signal 6 \\(Aborted\\); its last output: fault crash_rank: rank 2 aborts in step 1"},
    {"killed_rank", "^rank 1 was killed by signal 9 \\(Killed\\) from outside pipecheck: the kernel's OOM killer"},
    {"hang_rank", "^rank\\(s\\) 0, 1 still running after the 8 s deadline, none of them making progress for [0-9.]+ s "
                  "\\(hung\\): rank 0 waiting in 0[BF][0-9] \\(step 1\\) for its input from rank 1; rank 1 last "
                  "finished 1[A-Z_]+[0-9]+.*\\(step 1\\); nothing "
                  "started since; last output: .*rank 1: fault hang_rank: rank 1 stops"},
    // Data parallelism: the replica, stage and parameter where the gradients went wrong.
    {"dp_sum_not_average", "^gradient of .* at step 0 on replica [01] rank [01] \\(stage [01]\\): rel err 1 > tol"},
    {"dp_skip_stage", "^gradient of .* at step 0 on replica [01] rank 1 \\(stage 1\\): rel err"},
    {"dp_average_after_first_microbatch", "^gradient of .* at step 0 on replica [01] rank [01] \\(stage [01]\\): rel err"},
    {"dp_average_before_tied_sum", "^gradient of tok_embeddings.weight at step 0 on replica [01] rank [01] \\(stage [01]\\): rel err"},
    {"dp_local_token_mean", "^replica [01]: step 0, microbatch [0-9]+: gradient into stage 0 \\(from rank 1\\) rel err .*; worst "
                            "gradient .* on replica [01] rank [01] \\(stage [01]\\): rel err"},
    // Recomputation from a reused buffer: the first wrong boundary, then the parameter it spoiled most.
    {"recompute_stale_input", "^step 0, microbatch [0-9]+: gradient into stage [01] \\(from rank [12]\\) rel err .*; worst "
                              "gradient .* on rank [0-2] \\(stage [0-2]\\): rel err"},
    // Bug classes shipped since 2024. A stage holding only its latest input gradient: the first
    // gradient handed over for another microbatch (three stages on one rank, looped BFS).
    {"stage_keeps_latest_input_gradient", "^step 0, microbatch [12]: gradient into stage 1 \\(handed over on rank 0\\) rel "
                                          "err .*; worst gradient .* on rank 0 \\(stage [0-2]\\): rel err"},
    // A reused receive buffer's stale .grad: right at step 0, wrong from step 1 on.
    {"recv_buffer_stale_grad", "^step 1, microbatch [0-9]+: gradient into stage 0 \\(from rank 1\\) rel err .*; worst "
                               "gradient .* at step 1 on rank [01] \\(stage [01]\\): rel err"},
    // Rounds rescaled as a moving average, a stage re-initialised on a new length: the loss and
    // every boundary right, the parameters' gradients not.
    {"accumulation_rescaled_per_round", "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err"},
    {"reinit_on_seq_len_change", "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err"},
    {"loss_with_other_microbatch_labels", "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err"},
    // bfloat16 sums: within bfloat16's tolerance of the whole batch, caught against the float32 sums.
    {"sum_in_parameter_dtype", "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err .* > 0.001 against the "
                               "reference summing the same microbatches in float32 \\(a sum in bfloat16\\?\\)"},
};

// Faults that leave every value right (to rounding), so parity passes by design: `pipecheck
// invariance` sees reversed_accumulation (tests/invariance_test.cc), a baseline comparison sees
// slow_steps (tests/ci_outputs_test.py).
const std::set<std::string> kNotCaughtByParity = {"reversed_accumulation", "slow_steps"};

std::vector<std::string> FaultScenarios() {
  std::vector<std::string> names;
  for (const auto& scenario : harness::LoadSuite(kFaultSuite)) names.push_back(scenario.name);
  return names;
}

class Fault : public ::testing::TestWithParam<std::string> {};

TEST_P(Fault, IsCaughtAndItsControlPasses) {
  const auto suite = harness::LoadSuite(kFaultSuite);
  auto scenario = scenarios::FindScenario(suite, GetParam(), kFaultSuite);
  const auto options = testing::TestLaunchOptions(kFaultSuite, GetParam(), scenario.fault == "hang_rank" ? 8 : 60);
  const auto caught = harness::LaunchScenario(scenario, options);
  EXPECT_NE(caught.summary.status, reports::Status::kPass);
  EXPECT_EQ(caught.summary.ok, true);
  EXPECT_TRUE(std::regex_search(caught.summary.message, std::regex(kExpectedMessage.at(scenario.fault))))
      << scenario.fault << ": " << caught.summary.message;
  EXPECT_EQ(ChildProcesses(), 0) << "a worker outlived its scenario";
  if (scenario.fault == "crash_rank" || scenario.fault == "hang_rank" || scenario.fault == "killed_rank") {
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
      harness::LaunchScenario(scenario, testing::TestLaunchOptions(control_suite, GetParam() + "_control"));
  EXPECT_EQ(control.summary.status, reports::Status::kPass) << control.summary.message;
}

INSTANTIATE_TEST_SUITE_P(Suite, Fault, ::testing::ValuesIn(FaultScenarios()),
                         [](const auto& info) { return info.param; });

TEST(Faults, EveryFaultHasAScenarioAndTheLoaderKnowsEveryName) {
  std::set<std::string> covered;
  for (const auto& scenario : harness::LoadSuite(kFaultSuite)) covered.insert(scenario.fault);
  const auto& names = pipeline::FaultNames();
  for (size_t i = 1; i < names.size(); ++i) {
    if (kNotCaughtByParity.count(names[i])) {
      EXPECT_FALSE(covered.count(names[i])) << names[i] << " passes parity: it does not belong in faults.csv";
      EXPECT_NO_THROW(harness::ParseSuite("name,fault\nx," + names[i] + "\n", "f.csv")) << names[i];
      continue;
    }
    EXPECT_TRUE(covered.count(names[i])) << names[i] << " has no scenario in faults.csv";
    EXPECT_TRUE(kExpectedMessage.count(names[i])) << names[i];
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
    const std::string virtual_stages = name == "interleaved" ? "2" : "1";
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
