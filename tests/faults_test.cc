// Proving the verifier: every injected fault of scenarios/faults.csv is caught with a message
// that says what went wrong, the same scenario without its fault passes, no process outlives
// a scenario, and the run survives interrupts, busy ports and bad output directories.
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
    {"grad_scale_per_microbatch", "^gradient of tok_embeddings.weight at step 0 on rank 0: rel err"},
    {"zero_grad_per_microbatch", "^gradient of tok_embeddings.weight at step 0 on rank 0: rel err"},
    {"drop_microbatch", "^step 0, microbatch 3: gradient into stage 0 \\(from rank 1\\) rel err 1 > tol"},
    {"local_clip", "^gradient of .* at step 0 on rank [01]: rel err"},
    {"tied_norm_twice", "^gradient of .* at step 0 on rank [01]: rel err"},
    {"skip_tied_sync", "^communication, step 0: rank [02]'s message #[0-9]+ is a missing message: it posted nothing, where the plan has receive the tied weight's gradient"},
    {"stale_shape", "^rank 1 exited with code 1; its last output: pipecheck worker rank 1: The size of tensor"},
    {"optimizer_state_reset", "^update of .* at step 1 on rank [01]: rel err .* against one reference optimizer step"},
    {"clip_before_tied_sync", "^gradient of .* at step 0 on rank [01]: rel err"},
    {"double_grad_scaling", "^gradient of tok_embeddings.weight at step 0 on rank 0: rel err"},
    {"send_buffer_reuse", "^step 0, microbatch [0-9]+: activation into stage 1 changed between rank 0's send and rank 1's receive"},
    {"zb_shared_weight_grad_twice", "^gradient of tok_embeddings.weight at step 0 on rank [01]: rel err"},
    {"swap_boundary_shapes", "message from rank [01] \\(the .* for stage [0-9]+, microbatch [0-9]+\\) is .* but the plan expects"},
    {"duplicate_send", "^communication, step 0: rank 0's message #[0-9]+ is an extra message: it posted send the activation for stage 1, microbatch 0 to rank 1"},
    {"send_before_recv", "invalid when sends wait for receives: deadlock"},
    {"crash_rank", "^rank 2 was killed by signal 6 \\(Aborted\\); its last output: fault crash_rank: rank 2 aborts in step 1"},
    {"killed_rank", "^rank 1 was killed by signal 9 \\(Killed\\) from outside pipecheck: the kernel's OOM killer"},
    {"hang_rank", "^rank\\(s\\) 0, 1 still running after the 8 s deadline: rank 0 blocked in 0[BF][0-9] \\(step 1\\): awaiting "
                  "its input from rank 1, or computing; rank 1 last finished 1[A-Z_]+[0-9]+.*\\(step 1\\); nothing "
                  "started since; last output: .*rank 1: fault hang_rank: rank 1 stops"},
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
  EXPECT_NE(caught.Get("status"), "PASS");
  EXPECT_EQ(caught.Get("ok"), "1");
  EXPECT_TRUE(std::regex_search(caught.Get("message"), std::regex(kExpectedMessage.at(scenario.fault))))
      << scenario.fault << ": " << caught.Get("message");
  EXPECT_EQ(ChildProcesses(), 0) << "a worker outlived its scenario";
  if (scenario.fault == "crash_rank" || scenario.fault == "hang_rank" || scenario.fault == "killed_rank") {
    // The partial timeline, from the ranks' flight records, reaches into the step that failed
    // (step 1, half-way through the last rank's list).
    ASSERT_FALSE(caught.timeline.empty()) << scenario.fault;
    EXPECT_TRUE(std::any_of(caught.timeline.begin(), caught.timeline.end(), [](const auto& row) { return row[2] == "1"; }))
        << scenario.fault;
  }

  // The control: the same scenario without the fault passes.
  scenario.fault = "none";
  scenario.expect = "pass";
  const std::string control_suite = options.work_directory + "/control.csv";
  std::ofstream(control_suite) << testing::ScenariosCsv({scenario});
  const auto control =
      harness::LaunchScenario(scenario, testing::TestLaunchOptions(control_suite, GetParam() + "_control"));
  EXPECT_EQ(control.Get("status"), "PASS") << control.Get("message");
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
    EXPECT_EQ(static_cast<size_t>(pipeline::ParseFault(faults[i])), i) << faults[i];
    EXPECT_EQ(harness::ParseSuite("name,fault\nx," + faults[i] + "\n", "f.csv")[0].fault, faults[i]);
  }
  EXPECT_EQ(faults.front(), "none");
}

TEST(Launcher, ABusyPortIsReplacedByAFreeOne) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string suite = testing::ScratchDirectory("busy_port") + "/suite.csv";
  std::ofstream(suite) << "name,world_size,layers,hidden,batch,microbatches,seq_len\nbusy,2,2,16,4,2,8\n";
  auto options = testing::TestLaunchOptions(suite, "busy_port_work");
  options.port = ntohs(address.sin_port);
  const auto report = harness::LaunchScenario(harness::LoadSuite(suite)[0], options);
  close(listener);
  EXPECT_EQ(report.Get("status"), "PASS") << report.Get("message");
}

TEST(Launcher, CpuSharesAreContiguousDisjointAndEven) {
  using harness::CpusOfRank;
  EXPECT_EQ(CpusOfRank({0, 1}, 0, 2), (std::vector<int>{0}));
  EXPECT_EQ(CpusOfRank({0, 1}, 1, 2), (std::vector<int>{1}));
  EXPECT_EQ(CpusOfRank({0, 1, 2, 3, 4}, 0, 2), (std::vector<int>{0, 1, 2}));  // the first shares get the extra
  EXPECT_EQ(CpusOfRank({0, 1, 2, 3, 4}, 1, 2), (std::vector<int>{3, 4}));
  EXPECT_EQ(CpusOfRank({4, 6, 9}, 1, 3), (std::vector<int>{6}));  // the allowed CPUs, not 0..n-1
  EXPECT_EQ(CpusOfRank({0, 1}, 3, 4), (std::vector<int>{0, 1}));  // fewer CPUs than ranks: all of them
  EXPECT_EQ(CpusOfRank({7}, 0, 1), (std::vector<int>{7}));
  for (int ranks = 1; ranks <= 7; ++ranks) {
    std::vector<int> allowed(16);
    for (int i = 0; i < 16; ++i) allowed[i] = 2 * i;
    std::vector<int> joined;
    for (int r = 0; r < ranks; ++r) {
      const auto share = CpusOfRank(allowed, r, ranks);
      const size_t base = 16 / static_cast<size_t>(ranks);
      EXPECT_TRUE(share.size() == base || share.size() == base + 1) << ranks << " ranks, rank " << r;
      joined.insert(joined.end(), share.begin(), share.end());
    }
    EXPECT_EQ(joined, allowed) << ranks << " ranks: every CPU once, in order";
  }
}

// With bind_cpus (run --bind-cpus) each CPU rank is bound to its share, which its log's first
// line names; without, the ranks are left as they were.
TEST(Launcher, CpuRanksAreBoundToTheirShares) {
  const auto allowed = harness::AllowedCpus();
  ASSERT_FALSE(allowed.empty()) << "this process's CPUs could not be read";
  const std::string suite = testing::ScratchDirectory("cpu_binding") + "/suite.csv";
  std::ofstream(suite) << "name,world_size,layers,hidden,batch,microbatches,seq_len\nbound,2,2,16,4,2,8\n";
  for (const bool bind : {true, false}) {
    auto options = testing::TestLaunchOptions(suite, bind ? "cpu_binding_on" : "cpu_binding_off");
    options.bind_cpus = bind;
    const auto report = harness::LaunchScenario(harness::LoadSuite(suite)[0], options);
    EXPECT_EQ(report.Get("status"), "PASS") << report.Get("message");
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream log(options.work_directory + "/bound/rank" + std::to_string(rank) + ".log");
      std::string first;
      std::getline(log, first);
      const auto share = harness::CpusOfRank(allowed, rank, 2);
      std::string cpus;
      for (int cpu : share) cpus += (cpus.empty() ? "" : ",") + std::to_string(cpu);
      if (bind) {
        EXPECT_EQ(first.rfind("pipecheck: rank " + std::to_string(rank) + " bound to CPUs " + cpus + " of ", 0), 0u)
            << first;
      } else {
        EXPECT_EQ(first.find("bound to CPUs"), std::string::npos) << first;
      }
    }
  }
}

TEST(Run, SigintEndsEveryRankAndKeepsFinishedReports) {
  const std::string directory = testing::ScratchDirectory("sigint");
  // A previous run's reports in the same --out must not survive mixed with this run's rows.
  std::filesystem::create_directories(directory + "/out");
  std::ofstream(directory + "/out/summary.csv") << "scenario,status\nold_run_row,PASS\n";
  const std::string suite = directory + "/suite.csv";
  std::ofstream(suite) << "name,world_size,layers,hidden,batch,microbatches,seq_len,fault,expect\n"
                          "quick,2,2,16,4,2,8,none,pass\n"
                          "stuck,2,2,16,4,2,8,hang_rank,fail\n";
  const pid_t run = fork();
  ASSERT_GE(run, 0);
  if (run == 0) {
    const std::string out = directory + "/out";
    if (freopen((directory + "/run.log").c_str(), "w", stdout) == nullptr) _exit(126);
    const std::string junit = directory + "/ci/junit.xml", markdown = directory + "/ci/summary.md";
    execl(PIPECHECK_BINARY, PIPECHECK_BINARY, "run", "--scenarios", suite.c_str(), "--out", out.c_str(), "--junit",
          junit.c_str(), "--markdown", markdown.c_str(), nullptr);
    _exit(127);
  }
  const auto summary = directory + "/out/summary.csv";
  auto finished_rows = [&] {
    std::ifstream stream(summary);
    std::string line;
    int rows = -1;  // the header
    while (std::getline(stream, line)) rows += line.rfind("quick,", 0) == 0 || line.rfind("scenario,", 0) == 0;
    return rows;
  };
  for (int i = 0; i < 600 && finished_rows() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(finished_rows(), 1) << "the first scenario never finished";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the hung scenario is running
  kill(run, SIGINT);
  int status = 0;
  waitpid(run, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  std::ifstream log(directory + "/run.log");
  const std::string said((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(said.find("the reports hold the 1 scenario(s) that finished"), std::string::npos) << said;
  std::ifstream stream(summary);
  std::string header, first, extra;
  std::getline(stream, header);
  std::getline(stream, first);
  EXPECT_EQ(first.rfind("quick,PASS,", 0), 0u) << first;
  EXPECT_FALSE(std::getline(stream, extra)) << "an unfinished scenario was reported: " << extra;
  // CI still gets its test report: the finished scenario, the interrupted one as an error.
  std::ifstream junit_file(directory + "/ci/junit.xml");
  const std::string junit((std::istreambuf_iterator<char>(junit_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(junit.find("name=\"quick\""), std::string::npos) << junit;
  EXPECT_NE(junit.find("the run was interrupted by signal 2 (Interrupt) while this scenario ran"), std::string::npos)
      << junit;
  std::ifstream markdown_file(directory + "/ci/summary.md");
  const std::string markdown((std::istreambuf_iterator<char>(markdown_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(markdown.find("stuck"), std::string::npos) << markdown;
  // No worker of that run may survive it.
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string text((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find(suite), std::string::npos) << "process " << entry.path().filename() << " survived";
  }
}

}  // namespace
}  // namespace pipecheck
