// The process-per-rank launcher and the run around it: a busy rendezvous port is replaced, CPU
// ranks get contiguous disjoint shares of the CPUs (bound on request), and SIGINT ends every rank
// while the finished scenarios' reports, and CI's JUnit and Markdown, stay complete.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "harness/launcher.h"
#include "harness/scenario_model.h"
#include "scenarios/scenario.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {
// Deadlines follow progress: before the deadline nothing is ended; after it, a scenario is hung
// once nothing progressed for the stall window (half the deadline, at most 10 s), and one that
// keeps progressing runs on up to ten times its deadline.
TEST(Deadline, FollowsProgressNotTheWallClock) {
  using harness::DeadlineVerdict;
  using harness::JudgeDeadline;
  EXPECT_EQ(JudgeDeadline(7.9, 100.0, 8.0), DeadlineVerdict::kRunning);
  EXPECT_EQ(JudgeDeadline(8.1, 4.0, 8.0), DeadlineVerdict::kStalled);   // nothing for half of 8 s
  EXPECT_EQ(JudgeDeadline(8.1, 3.9, 8.0), DeadlineVerdict::kRunning);   // still computing, slowly
  EXPECT_EQ(JudgeDeadline(79.0, 0.1, 8.0), DeadlineVerdict::kRunning);
  EXPECT_EQ(JudgeDeadline(80.5, 0.1, 8.0), DeadlineVerdict::kOverCap);  // ten times the deadline
  EXPECT_EQ(JudgeDeadline(301.0, 9.9, 300.0), DeadlineVerdict::kRunning);
  EXPECT_EQ(JudgeDeadline(301.0, 10.0, 300.0), DeadlineVerdict::kStalled);  // the window stops at 10 s
}

// Threads per rank are sized from the cores this process may use: restricted to one CPU (as
// taskset or a CI runner's cpuset does), it may use one.
TEST(Launcher, UsableCoresFollowTheAffinityMask) {
  const auto allowed = harness::AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  EXPECT_GE(harness::UsableCores(), 1);
  EXPECT_LE(harness::UsableCores(), static_cast<int>(allowed.size()));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(allowed.front(), &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) _exit(2);
    _exit(harness::UsableCores() == 1 ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A process's CPU time: this one's grows while it computes; a process that does not exist has none.
TEST(Deadline, CpuSecondsOfAProcess) {
  const auto before = harness::CpuSeconds(getpid());
  ASSERT_TRUE(before.has_value());
  volatile double x = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(300)) x = x + 1;
  const auto after = harness::CpuSeconds(getpid());
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(*after - *before, 0.05);
  EXPECT_FALSE(harness::CpuSeconds(-5).has_value());
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
  auto options = testing::TestLaunchOptions("busy_port_work");
  options.port = ntohs(address.sin_port);
  const auto report = harness::LaunchScenario(harness::LoadSuite(suite)[0], options);
  close(listener);
  EXPECT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
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
    auto options = testing::TestLaunchOptions(bind ? "cpu_binding_on" : "cpu_binding_off");
    options.bind_cpus = bind;
    const auto report = harness::LaunchScenario(harness::LoadSuite(suite)[0], options);
    EXPECT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream log(options.work_directory + "/bound/rank" + std::to_string(rank) + ".log");
      std::string first;
      std::getline(log, first);
      const auto share = harness::CpusOfRank(allowed, rank, 2);
      const std::string cpus = fmt::format("{}", fmt::join(share, ","));
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
