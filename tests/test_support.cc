// Test helpers (see test_support.h).
#include "tests/test_support.h"

#include "harness/run_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

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

namespace {

// The scratch directories this process made. After the last test they are removed if every test
// passed; a failed run keeps them (their paths printed) for its logs and reports, and so does any
// run with PIPECHECK_KEEP_SCRATCH=1 in its environment.
class ScratchDirectories : public ::testing::Environment {
 public:
  void Add(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& known : paths_) {
      if (known == path) return;
    }
    paths_.push_back(path);
  }

  void TearDown() override {
    std::lock_guard<std::mutex> lock(mutex_);
    const char* keep = std::getenv("PIPECHECK_KEEP_SCRATCH");
    const bool kept = (keep != nullptr && std::string(keep) == "1") || !::testing::UnitTest::GetInstance()->Passed();
    for (const auto& path : paths_) {
      if (kept) {
        std::fprintf(stderr, "scratch kept: %s\n", path.c_str());
        continue;
      }
      try {
        harness::RemoveTree(path);  // not std::filesystem::remove_all (harness/run_directory.h)
      } catch (const std::exception& error) {
        std::fprintf(stderr, "scratch not removed: %s\n", error.what());
      }
    }
    paths_.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> paths_;
};

// Registered before main runs; GoogleTest owns (and deletes) it.
ScratchDirectories* const scratch_directories = [] {
  auto* environment = new ScratchDirectories;
  ::testing::AddGlobalTestEnvironment(environment);
  return environment;
}();

}  // namespace

std::string ScratchDirectory(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pipecheck_test_" + name + "_" + std::to_string(getpid()));
  harness::RemoveTree(path.string());
  std::filesystem::create_directories(path);
  scratch_directories->Add(path.string());
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
