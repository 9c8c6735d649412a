// The parity judge itself: fed the reference's own numbers it passes; a gradient off by 1e-6,
// a missing or zeroed gradient, a drifted loss or weight each fail with a message naming
// what, where and when.
#include <gtest/gtest.h>

#include "harness/parity.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

class ParityJudge : public ::testing::Test {
 protected:
  void SetUp() override {
    scenario_ = scenarios::ParseScenarios("name,flavor\njudge,gpt2\n", "judge.csv")[0];
    auto config = testing::TinyConfig(reference::Flavor::kGpt2, false);
    config.steps = 2;
    reference_ = reference::ReferenceTrainer(config).Train();
    // A one-rank "pipeline" that reproduced the reference exactly.
    rank_ = pipeline::RankResult();
    rank_.rank = 0;
    rank_.stages = {0};
    for (const auto& step : reference_.steps) {
      rank_.losses.push_back(step.loss);
      rank_.step_ms.push_back(1.0);
      rank_.gradients.push_back(Copy(step.gradients));
    }
    rank_.final_weights = Copy(reference_.final_weights);
    simulation_ = pipeline::ValidateSchedule(pipeline::AddCommunication(pipeline::GPipeSchedule({1, 1, 1})));
  }

  static reference::NamedTensors Copy(const reference::NamedTensors& tensors) {
    reference::NamedTensors copy;
    for (const auto& item : tensors) copy.insert(item.key(), item.value().clone());
    return copy;
  }

  reports::ScenarioReport Judge() {
    std::vector<pipeline::RankResult> ranks = {rank_};
    return harness::CompareWithReference({scenario_, reference_, ranks, simulation_});
  }

  scenarios::Scenario scenario_;
  reference::TrainResult reference_;
  pipeline::RankResult rank_;
  pipeline::SimulationResult simulation_;
};

TEST_F(ParityJudge, IdenticalResultsPass) {
  const auto report = Judge();
  EXPECT_EQ(report.Get("status"), "PASS") << report.Get("message");
  EXPECT_EQ(report.Get("ok"), "1");
  EXPECT_EQ(report.Get("grad_max_rel_err"), "0");
  EXPECT_EQ(report.steps.size(), 2u);
  EXPECT_EQ(report.params.size(), reference_.final_weights.size());
}

TEST_F(ParityJudge, GradientOffByOneInAMillionFailsNamingParameterAndStep) {
  rank_.gradients[1]["layers.1.feed_forward.w2.weight"].mul_(1 + 1e-6);
  const auto report = Judge();
  EXPECT_EQ(report.Get("status"), "FAIL");
  EXPECT_EQ(report.Get("ok"), "0");
  EXPECT_EQ(report.Get("worst_param"), "layers.1.feed_forward.w2.weight");
  EXPECT_EQ(report.Get("message").rfind("gradient of layers.1.feed_forward.w2.weight at step 1 on rank 0: rel err 1e-06", 0),
            0u)
      << report.Get("message");
}

TEST_F(ParityJudge, MissingAndZeroGradientsFail) {
  auto& step0 = rank_.gradients[0];
  reference::NamedTensors without;
  for (const auto& item : step0) {
    if (item.key() != "norm.weight") without.insert(item.key(), item.value());
  }
  step0 = without;
  EXPECT_EQ(Judge().Get("message").rfind("gradient of norm.weight at step 0 is missing from every rank", 0), 0u)
      << Judge().Get("message");
  SetUp();
  rank_.gradients[0]["layers.0.attention.wq.weight"].zero_();
  EXPECT_NE(Judge().Get("message").find("gradient of layers.0.attention.wq.weight at step 0 is all zero on rank 0"),
            std::string::npos)
      << Judge().Get("message");
}

TEST_F(ParityJudge, LossAndWeightDriftFail) {
  rank_.losses[1] += 1e-7;
  EXPECT_EQ(Judge().Get("message").rfind("loss at step 1:", 0), 0u) << Judge().Get("message");
  SetUp();
  rank_.final_weights["output.weight"].add_(1e-6);
  EXPECT_EQ(Judge().Get("message").rfind("final weight output.weight on rank 0", 0), 0u) << Judge().Get("message");
}

TEST_F(ParityJudge, NumericallyZeroGradientsAreNamedAndStillChecked) {
  // gpt2's key biases have zero gradients analytically: the judge names them...
  EXPECT_NE(Judge().Get("message").find("layers.0.attention.wk.bias"), std::string::npos) << Judge().Get("message");
  // ...and a pipeline whose key-bias gradient is not noise-sized fails.
  rank_.gradients[0]["layers.0.attention.wk.bias"].add_(1e-3);
  EXPECT_EQ(Judge().Get("status"), "FAIL");
}

TEST(ParityExpectation, FailExpectationIsMetByAnyNonPass) {
  EXPECT_TRUE(harness::MeetsExpectation("PASS", "pass"));
  EXPECT_FALSE(harness::MeetsExpectation("FAIL", "pass"));
  EXPECT_TRUE(harness::MeetsExpectation("FAIL", "fail"));
  EXPECT_TRUE(harness::MeetsExpectation("ERROR", "fail"));
  EXPECT_TRUE(harness::MeetsExpectation("TIMEOUT", "fail"));
  EXPECT_FALSE(harness::MeetsExpectation("PASS", "fail"));
}

}  // namespace
}  // namespace pipecheck
