// Saying where it went wrong: boundary fingerprints see what they must (scaling, zeroing,
// swapped rows, one changed bit), a passing multi-rank run records every boundary tensor on both
// sides and every message against the plan with nothing off, and the communication check names
// an extra, missing, reordered or mis-shaped message for what it is. The faults that show at a
// boundary or in the messages are checked end to end in faults_test.cc.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <map>
#include <set>
#include <tuple>

#include "harness/comm_check.h"
#include "harness/launcher.h"
#include "harness/scenario_model.h"
#include "pipeline/comm_record.h"
#include "pipeline/trainer.h"
#include "reference/fingerprint.h"
#include "reports/report.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

using reference::FingerprintError;
using reference::FingerprintOf;

torch::Tensor Activation() {
  torch::manual_seed(7);
  return torch::randn({4, 8, 16}, torch::kFloat64);  // (b, t, hidden)
}

TEST(Fingerprint, IdenticalTensorsMatchBitwise) {
  const auto a = FingerprintOf(Activation()), b = FingerprintOf(Activation().clone());
  EXPECT_EQ(FingerprintError(a, b), 0.0);
  EXPECT_TRUE(a.hashed);
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_TRUE(reference::SameBytes(a, b, torch::kFloat64));
}

TEST(Fingerprint, SeesScalingZeroingSwappedRowsAndOneChangedElement) {
  const auto tensor = Activation();
  const auto want = FingerprintOf(tensor);
  EXPECT_NEAR(FingerprintError(FingerprintOf(tensor * 1.01), want), 0.01, 1e-9);
  EXPECT_EQ(FingerprintError(FingerprintOf(torch::zeros_like(tensor)), want), 1.0);
  auto swapped = tensor.clone();
  swapped[0].copy_(tensor[1]);
  swapped[1].copy_(tensor[0]);
  const auto swapped_print = FingerprintOf(swapped);
  EXPECT_GT(FingerprintError(swapped_print, want), 1e-6) << "rows swapped: only the row-weighted sum can see it";
  EXPECT_NE(swapped_print.hash, want.hash);
  auto nudged = tensor.clone();
  nudged[2][3][4] += 1e-12;
  EXPECT_NE(FingerprintOf(nudged).hash, want.hash);
  EXPECT_FALSE(reference::SameBytes(FingerprintOf(nudged), want, torch::kFloat64));
  EXPECT_TRUE(std::isinf(FingerprintError(FingerprintOf(tensor.narrow(1, 0, 7)), want))) << "another shape";
}

TEST(Fingerprint, WithoutHashesSameBytesAllowsOnlyRounding) {
  auto a = FingerprintOf(Activation().to(torch::kFloat32)), b = a;
  a.hashed = b.hashed = false;  // as a GPU's float32 fingerprints are
  EXPECT_TRUE(reference::SameBytes(a, b, torch::kFloat32));
  b.norm *= 1 + 1e-4;
  EXPECT_FALSE(reference::SameBytes(a, b, torch::kFloat32));
}

// Every boundary of every step and microbatch, once per side; every message as planned.
void ExpectCompleteAndClean(const std::string& suite_path, const std::string& name) {
  const auto suite = harness::LoadSuite(suite_path);
  const auto scenario = scenarios::FindScenario(suite, name, suite_path);
  const auto report = harness::LaunchScenario(scenario, testing::TestLaunchOptions(name));
  ASSERT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
  const auto config = harness::ToPipelineConfig(scenario);
  const auto schedule = pipeline::BuildSchedule(config);
  const auto& shape = schedule.shape;
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, std::multiset<std::string>> roles;
  for (const auto& row : report.boundaries) {
    EXPECT_TRUE(row.ok) << fmt::format("{}", fmt::join(reports::Cells(reports::BoundaryFields(), row), ","));
    roles[{row.step, row.microbatch, row.stage, row.direction}].insert(row.role);
  }
  size_t expected = 0;
  for (int64_t step = 0; step < scenario.steps; ++step) {
    for (int mb = 0; mb < scenario.microbatches; ++mb) {
      for (int s = 1; s < shape.stages(); ++s) {
        const bool local = shape.RankOfStage(s) == shape.RankOfStage(s - 1);
        const std::multiset<std::string> want =
            local ? std::multiset<std::string>{"handed_over"} : std::multiset<std::string>{"received", "sent"};
        EXPECT_EQ((roles[{step, mb, s, "activation"}]), want)
            << "step " << step << " microbatch " << mb << " activation into stage " << s;
        EXPECT_EQ((roles[{step, mb, s - 1, "gradient"}]), want)
            << "step " << step << " microbatch " << mb << " gradient into stage " << s - 1;
        expected += 2 * want.size();
      }
    }
  }
  EXPECT_EQ(report.boundaries.size(), expected);
  size_t planned = 0;
  for (int64_t step = 0; step < scenario.steps; ++step) {
    const auto batch = reference::MakeBatch(config.train.data, config.train.seed, step);
    for (int rank = 0; rank < scenario.world_size; ++rank) {
      planned += pipeline::PlannedMessages(config, schedule, rank, step, batch).size();
    }
  }
  EXPECT_GT(planned, 0u);
  EXPECT_EQ(report.comm.size(), planned);
  for (const auto& row : report.comm) {
    EXPECT_TRUE(row.ok) << fmt::format("{}", fmt::join(reports::Cells(reports::CommFields(), row), ","));
  }
}

TEST(FirstDivergence, TiedAcrossThreeRanksRecordsEveryBoundaryAndMessage) {
  ExpectCompleteAndClean(PIPECHECK_SOURCE_DIR "/scenarios/core.csv", "ws3_tied_across_ranks");
}

TEST(FirstDivergence, VWithEmptyStagesAndHandoversRecordsEveryBoundaryAndMessage) {
  ExpectCompleteAndClean(PIPECHECK_SOURCE_DIR "/tests/data/parity.csv", "ws3_zbv_tied_empty_rank_varlen");
}

// The communication check on rank 0's own plan, edited.
class CommCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    scenario_ = harness::ParseSuite("name,world_size,microbatches,steps\ncomm,2,4,1\n", "comm.csv")[0];
    config_ = harness::ToPipelineConfig(scenario_);
    schedule_ = pipeline::BuildSchedule(config_);
    const auto batch = reference::MakeBatch(config_.train.data, config_.train.seed, 0);
    for (int rank = 0; rank < 2; ++rank) {
      ranks_.emplace_back();
      ranks_.back().rank = rank;
      ranks_.back().messages = pipeline::PlannedMessages(config_, schedule_, rank, 0, batch);
    }
  }
  std::string FirstProblem() {
    const auto verdict = harness::CheckCommunication({scenario_.name, config_, schedule_, ranks_});
    return verdict.first_problem.at(0);
  }
  std::vector<pipeline::MessageRecord>& Messages() { return ranks_[0].messages; }

  scenarios::Scenario scenario_;
  pipeline::PipelineConfig config_;
  pipeline::Schedule schedule_;
  std::vector<pipeline::RankResult> ranks_;
};

TEST_F(CommCheck, ThePlanItselfPasses) { EXPECT_EQ(FirstProblem(), ""); }

TEST_F(CommCheck, NamesAnExtraMessage) {
  Messages().insert(Messages().begin() + 2, Messages()[1]);
  EXPECT_EQ(FirstProblem().rfind("communication, step 0: rank 0's message #2 is an extra message: it posted ", 0), 0u)
      << FirstProblem();
}

TEST_F(CommCheck, NamesAMissingMessage) {
  Messages().erase(Messages().begin() + 1);
  EXPECT_EQ(FirstProblem().rfind("communication, step 0: rank 0's message #1 is a missing message", 0), 0u)
      << FirstProblem();
  Messages().pop_back();
  Messages().resize(1);
  EXPECT_NE(FirstProblem().find("posted nothing, where the plan has"), std::string::npos) << FirstProblem();
}

TEST_F(CommCheck, NamesMessagesOutOfOrder) {
  std::swap(Messages()[1], Messages()[3]);
  EXPECT_EQ(FirstProblem().rfind("communication, step 0: rank 0's message #1 is a message out of order", 0), 0u)
      << FirstProblem();
}

TEST_F(CommCheck, NamesAMisShapedMessage) {
  Messages()[2].shape.sizes[1] += 1;
  EXPECT_EQ(FirstProblem().rfind("communication, step 0: rank 0's message #2 is a mis-shaped message", 0), 0u)
      << FirstProblem();
}

}  // namespace
}  // namespace pipecheck
