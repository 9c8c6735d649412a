// The predicted step time (harness::PredictStepMs) on timelines built by hand: it reproduces steps
// whose waits the schedule explains, leaves out a wait it does not explain, follows each step's
// own slow actions rather than a path through per-action medians, and refuses timelines that do
// not fit the schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "harness/measurements.h"
#include "pipeline/rank_result.h"
#include "pipeline/schedule.h"
#include "pipeline/lowering.h"
#include "pipeline/message.h"
#include "pipeline/schedule_csv.h"
#include "pipeline/simulator.h"
#include "reference/trainer.h"

namespace pipecheck {
namespace {

using pipeline::ActionKind;

// GPipe on 2 ranks with 2 microbatches, lowered as every rank runs it.
pipeline::Schedule TwoRankGPipe() {
  pipeline::PipelineShape shape;
  shape.ranks = 2;
  shape.microbatches = 2;
  return pipeline::LowerSchedule(pipeline::GPipeSchedule(shape));
}

// Per-action durations in µs for one step: compute actions from `compute(rank, action)`, every
// communication call 10 µs.
template <typename ComputeUs>
std::vector<std::vector<double>> Durations(const pipeline::Schedule& schedule, ComputeUs compute) {
  std::vector<std::vector<double>> durations(schedule.ranks.size());
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    for (const auto& action : schedule.ranks[r]) {
      durations[r].push_back(action.IsCompute() ? compute(static_cast<int>(r), action) : 10.0);
    }
  }
  return durations;
}

// Ranks that ran `steps` (the first untimed), each step as the simulator runs it on that step's
// durations, `after_ms` after each rank's last action (optimizer and the like).
std::vector<pipeline::RankResult> RanksThatRan(const pipeline::Schedule& schedule,
                                               const std::vector<std::vector<std::vector<double>>>& steps,
                                               double after_ms) {
  std::vector<pipeline::RankResult> ranks(schedule.ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r].rank = static_cast<int>(r);
  for (size_t step = 0; step < steps.size(); ++step) {
    pipeline::CostModel costs;
    costs.per_action = steps[step];
    const auto simulated = pipeline::Simulate(schedule, pipeline::SendSemantics::kBuffered, costs);
    EXPECT_TRUE(simulated.ok) << simulated.error;
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
        pipeline::ActionTiming timing;
        timing.step = static_cast<int64_t>(step);
        timing.action = schedule.ranks[r][i];
        timing.start_us = simulated.start_times[r][i];
        timing.wait_start_us = timing.start_us;
        timing.end_us = timing.start_us + steps[step][r][i];
        ranks[r].timeline.push_back(timing);
      }
      ranks[r].step_ms.push_back(simulated.finish[r] / 1000.0 + after_ms);
    }
  }
  return ranks;
}

TEST(StepPrediction, ReproducesStepsWhoseWaitsTheScheduleExplains) {
  const auto schedule = TwoRankGPipe();
  auto uniform = [](double forward_us) {
    return [=](int, const pipeline::Action& a) { return a.kind == ActionKind::kForward ? forward_us : 2 * forward_us; };
  };
  // The untimed first step is slow; it must not count.
  const std::vector<std::vector<std::vector<double>>> steps = {
      Durations(schedule, uniform(9000)), Durations(schedule, uniform(1000)), Durations(schedule, uniform(1100)),
      Durations(schedule, uniform(1050))};
  const auto ranks = RanksThatRan(schedule, steps, 3.0);
  const auto predicted = harness::PredictStepMs(schedule, ranks, steps.size());
  ASSERT_TRUE(predicted.ok());
  ASSERT_EQ(predicted.rank_ms.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    const double measured = reference::Median({ranks[r].step_ms[1], ranks[r].step_ms[2], ranks[r].step_ms[3]});
    EXPECT_NEAR(predicted.rank_ms[r], measured, 1e-9) << "rank " << r;
  }
  // The median step has F = 1.05 ms and B = 2.1 ms: GPipe's (m + p - 1) (F + B), the communication
  // calls' 10 µs each on the way, then the 3 ms after the last action.
  EXPECT_GT(predicted.step_ms, 3.0 + 3 * (1.05 + 2.1));
  EXPECT_LT(predicted.step_ms, 3.0 + 3 * (1.05 + 2.1) + 0.2);
}

TEST(StepPrediction, LeavesOutAWaitTheScheduleDoesNotExplain) {
  const auto schedule = TwoRankGPipe();
  auto durations = Durations(schedule, [](int, const pipeline::Action& a) {
    return a.kind == ActionKind::kForward ? 1000.0 : 2000.0;
  });
  auto ranks = RanksThatRan(schedule, {durations, durations, durations, durations}, 0.0);
  const auto before = harness::PredictStepMs(schedule, ranks, 4);
  ASSERT_TRUE(before.ok());
  // Rank 1 stalls 5 ms before its first backward in every step (a sync, a receive posted late):
  // no action's duration holds it and no message explains it.
  const size_t stall_at = static_cast<size_t>(
      std::find_if(schedule.ranks[1].begin(), schedule.ranks[1].end(),
                   [](const pipeline::Action& a) { return a.kind == ActionKind::kBackward; }) -
      schedule.ranks[1].begin());
  for (auto& timing : ranks[1].timeline) {
    const size_t index = static_cast<size_t>(&timing - &ranks[1].timeline[0]) % schedule.ranks[1].size();
    if (index < stall_at) continue;
    timing.start_us += 5000;
    timing.wait_start_us += 5000;
    timing.end_us += 5000;
  }
  for (double& ms : ranks[1].step_ms) ms += 5.0;
  const auto after = harness::PredictStepMs(schedule, ranks, 4);
  ASSERT_TRUE(after.ok());
  EXPECT_NEAR(after.rank_ms[1], before.rank_ms[1], 1e-9);
  EXPECT_NEAR(ranks[1].step_ms[2] - after.rank_ms[1], 5.0, 1e-9);
}

TEST(StepPrediction, FollowsEachStepsSlowActionsNotAPathThroughMedians) {
  // Ranks sharing cores: in each timed step another forward runs slow (8 ms instead of 1). Every
  // action's median is 1 ms, so the schedule simulated on medians is far shorter than any step.
  const auto schedule = TwoRankGPipe();
  auto slow = [](int slow_rank, int slow_microbatch) {
    return [=](int rank, const pipeline::Action& a) {
      if (a.kind != ActionKind::kForward) return 2000.0;
      return rank == slow_rank && a.microbatch == slow_microbatch ? 8000.0 : 1000.0;
    };
  };
  const std::vector<std::vector<std::vector<double>>> steps = {
      Durations(schedule, slow(0, 0)), Durations(schedule, slow(0, 0)), Durations(schedule, slow(1, 1)),
      Durations(schedule, slow(0, 1))};
  const auto ranks = RanksThatRan(schedule, steps, 0.0);
  const auto predicted = harness::PredictStepMs(schedule, ranks, steps.size());
  ASSERT_TRUE(predicted.ok());
  std::vector<double> slowest;
  for (size_t step = 1; step < steps.size(); ++step) {
    slowest.push_back(std::max(ranks[0].step_ms[step], ranks[1].step_ms[step]));
  }
  EXPECT_NEAR(predicted.step_ms, reference::Median(slowest), 1e-9);

  pipeline::CostModel medians;
  medians.per_action = Durations(schedule, slow(-1, -1));
  const auto on_medians = pipeline::Simulate(schedule, pipeline::SendSemantics::kBuffered, medians);
  ASSERT_TRUE(on_medians.ok);
  EXPECT_GT(predicted.step_ms, on_medians.makespan / 1000.0 + 6.0);
}

TEST(StepPrediction, RefusesTimelinesThatDoNotFitTheSchedule) {
  const auto schedule = TwoRankGPipe();
  const auto durations = Durations(schedule, [](int, const pipeline::Action&) { return 1000.0; });
  auto ranks = RanksThatRan(schedule, {durations, durations, durations}, 0.0);
  ASSERT_TRUE(harness::PredictStepMs(schedule, ranks, 3).ok());

  auto missing = ranks;  // rank 0 lost its last action of step 2
  missing[0].timeline.erase(missing[0].timeline.end() - 1);
  EXPECT_FALSE(harness::PredictStepMs(schedule, missing, 3).ok());

  auto extra = ranks;  // rank 1 reports an action more in step 1 than its list holds
  extra[1].timeline.insert(extra[1].timeline.begin() + static_cast<long>(schedule.ranks[1].size()),
                           extra[1].timeline[schedule.ranks[1].size()]);
  EXPECT_FALSE(harness::PredictStepMs(schedule, extra, 3).ok());

  auto one_rank = ranks;  // the results of one rank only
  one_rank.pop_back();
  EXPECT_FALSE(harness::PredictStepMs(schedule, one_rank, 3).ok());
}

}  // namespace
}  // namespace pipecheck
