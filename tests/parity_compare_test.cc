// The parity judge itself: fed the reference's own numbers it passes; a gradient off by 1e-6,
// a missing or zeroed gradient, a drifted loss, a wrong update or a wrong initial weight each
// fail with a message naming what, where and when; a diverging reference is an ERROR.
#include <gtest/gtest.h>

#include "harness/parity.h"
#include "pipeline/lowering.h"
#include "harness/scenario_model.h"
#include "reports/verdict.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

class ParityJudge : public ::testing::Test {
 protected:
  void SetUp() override { Build("name,flavor\njudge,gpt2\n"); }

  // A one-rank "pipeline" that reproduced the reference exactly: the reference's own steps,
  // with the weights each step started from.
  void Build(const std::string& csv, int steps = 2) {
    scenario_ = harness::ParseSuite(csv, "judge.csv")[0];
    config_ = testing::TinyConfig(scenario_.flavor == "gpt2" ? reference::Flavor::kGpt2 : reference::Flavor::kLlama, false);
    config_.steps = steps;
    scenario_.vocab = config_.model.vocab;
    scenario_.steps = steps;
    reference::ReferenceTrainer trainer(config_);
    rank_ = pipeline::RankResult();
    rank_.rank = 0;
    rank_.stages = {0};
    for (int k = 0; k < steps; ++k) {
      rank_.weights.push_back(trainer.Weights());
      const auto step = trainer.Step(k);
      rank_.losses.push_back(step.loss);
      rank_.step_ms.push_back(1.0);
      rank_.gradients.push_back(Copy(step.gradients));
    }
    rank_.final_weights = trainer.Weights();
    schedule_ = pipeline::AddCommunication(pipeline::GPipeSchedule({1, 1, 1}));
    simulation_ = pipeline::ValidateSchedule(schedule_);
  }

  static reference::NamedTensors Copy(const reference::NamedTensors& tensors) {
    reference::NamedTensors copy;
    for (const auto& item : tensors) copy.insert(item.key(), item.value().clone());
    return copy;
  }

  reports::ScenarioReport Judge() {
    std::vector<pipeline::RankResult> ranks = {rank_};
    harness::Oracle oracle(config_, 1);
    return harness::CompareWithReference({scenario_, oracle, ranks, schedule_, simulation_, memory_});
  }

  scenarios::Scenario scenario_;
  reference::TrainConfig config_;
  pipeline::RankResult rank_;
  pipeline::Schedule schedule_;
  pipeline::SimulationResult simulation_;
  pipeline::MemoryPrediction memory_;  // none: the judge does not need one
};

TEST_F(ParityJudge, IdenticalResultsPass) {
  const auto report = Judge();
  EXPECT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
  EXPECT_EQ(report.summary.ok, true);
  EXPECT_EQ(report.summary.grad_max_rel_err, 0.0);
  EXPECT_EQ(report.steps.size(), 2u);
  EXPECT_EQ(report.params.size(), rank_.final_weights.size());
  EXPECT_EQ(report.summary.weights_max_rel_err, 0.0);
}

TEST_F(ParityJudge, GradientOffByOneInAMillionFailsNamingParameterAndStep) {
  rank_.gradients[1]["layers.1.feed_forward.w2.weight"].mul_(1 + 1e-6);
  const auto report = Judge();
  EXPECT_EQ(report.summary.status, reports::Status::kFail);
  EXPECT_EQ(report.summary.ok, false);
  EXPECT_EQ(report.summary.worst_param, "layers.1.feed_forward.w2.weight");
  EXPECT_EQ(report.summary.message.rfind("gradient of layers.1.feed_forward.w2.weight at step 1 on rank 0 (stage 0): rel err 1e-06", 0),
            0u)
      << report.summary.message;
}

TEST_F(ParityJudge, MissingAndZeroGradientsFail) {
  auto& step0 = rank_.gradients[0];
  reference::NamedTensors without;
  for (const auto& item : step0) {
    if (item.key() != "norm.weight") without.insert(item.key(), item.value());
  }
  step0 = without;
  EXPECT_EQ(Judge().summary.message.rfind("gradient of norm.weight at step 0 is missing from every rank", 0), 0u)
      << Judge().summary.message;
  SetUp();
  rank_.gradients[0]["layers.0.attention.wq.weight"].zero_();
  EXPECT_NE(Judge().summary.message.find("gradient of layers.0.attention.wq.weight at step 0 is all zero on rank 0"),
            std::string::npos)
      << Judge().summary.message;
}

TEST_F(ParityJudge, LossAndWeightDriftFail) {
  rank_.losses[1] += 1e-7;
  EXPECT_EQ(Judge().summary.message.rfind("loss at step 1:", 0), 0u) << Judge().summary.message;
  SetUp();
  rank_.final_weights["output.weight"].add_(1e-6);
  EXPECT_EQ(Judge().summary.message.rfind("update of output.weight at step 1 on rank 0", 0), 0u) << Judge().summary.message;
  SetUp();
  rank_.weights[0]["norm.weight"].add_(1e-3);
  EXPECT_EQ(Judge().summary.message.rfind("initial weight norm.weight: rel err", 0), 0u) << Judge().summary.message;
}

TEST_F(ParityJudge, AnOptimizerThatForgetsItsStateFailsAtTheStepItForgot) {
  // The pipeline's step-1 update made by a fresh AdamW (state reset) instead of the running one.
  Build("name,flavor\njudge,gpt2\n", 3);
  reference::ReferenceTrainer fresh(config_);
  fresh.SetWeights(rank_.weights[1]);
  fresh.ApplyGradients(rank_.gradients[1]);
  rank_.weights[2] = fresh.Weights();
  EXPECT_EQ(Judge().summary.message.rfind("update of ", 0), 0u) << Judge().summary.message;
  EXPECT_NE(Judge().summary.message.find(" at step 1 on rank 0"), std::string::npos) << Judge().summary.message;
}

TEST_F(ParityJudge, AnalyticallyZeroGradientsAreCheckedAgainstAFloorThatIgnoresTol) {
  // gpt2's key biases have zero gradients analytically: noise-sized ones pass...
  EXPECT_EQ(Judge().summary.status, reports::Status::kPass) << Judge().summary.message;
  // ...a key-bias gradient that is not noise-sized fails...
  rank_.gradients[0]["layers.0.attention.wk.bias"].add_(1e-3);
  EXPECT_EQ(Judge().summary.status, reports::Status::kFail);
  // ...and the floor does not grow with tol: the largest tol allowed still sees a dropped
  // gradient (a whole parameter's gradient zeroed).
  Build("name,flavor,dtype,tol\njudge,gpt2,float64,1e-6\n");
  rank_.gradients[0]["layers.1.feed_forward.w1.weight"].zero_();
  EXPECT_NE(Judge().summary.message.find("gradient of layers.1.feed_forward.w1.weight at step 0 is all zero"),
            std::string::npos)
      << Judge().summary.message;
  EXPECT_EQ(scenarios::DtypeOf("float64").floor_fraction, 1e-5);
}

TEST_F(ParityJudge, ADivergingReferenceIsAnErrorNotAVerdict) {
  Build("name,flavor,optimizer,lr\njudge,gpt2,sgd,10\n", 6);
  config_.optimizer = {reference::OptimizerKind::kSgd, 1e4};
  const auto report = Judge();
  EXPECT_EQ(report.summary.status, reports::Status::kError) << report.summary.message;
  EXPECT_EQ(report.summary.message.rfind("reference diverged at step ", 0), 0u) << report.summary.message;
}

TEST(ParityExpectation, FailExpectationIsMetByAnyNonPass) {
  using reports::Status;
  EXPECT_TRUE(reports::MeetsExpectation(Status::kPass, "pass"));
  EXPECT_TRUE(reports::MeetsExpectation(Status::kSkipped, "pass"));
  EXPECT_FALSE(reports::MeetsExpectation(Status::kFail, "pass"));
  EXPECT_TRUE(reports::MeetsExpectation(Status::kFail, "fail"));
  EXPECT_TRUE(reports::MeetsExpectation(Status::kError, "fail"));
  EXPECT_TRUE(reports::MeetsExpectation(Status::kTimeout, "fail"));
  EXPECT_FALSE(reports::MeetsExpectation(Status::kPass, "fail"));
}

}  // namespace
}  // namespace pipecheck
