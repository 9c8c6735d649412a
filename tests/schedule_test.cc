// Schedules as data: the action text form, the GPipe and 1F1B generators' properties over
// many shapes, and the simulator rejecting hand-broken schedules with the step named.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "harness/scenario_model.h"
#include "pipeline/schedule.h"
#include "pipeline/lowering.h"
#include "pipeline/message.h"
#include "pipeline/schedule_csv.h"
#include "pipeline/simulator.h"

namespace pipecheck {
namespace {

using pipeline::Action;
using pipeline::ActionKind;
using pipeline::PipelineShape;
using pipeline::Schedule;

// The error ValidateSchedule throws, or "" when it accepts.
std::string RejectionOf(const Schedule& schedule) {
  try {
    pipeline::ValidateSchedule(schedule);
  } catch (const pipeline::ScheduleError& error) {
    return error.what();
  }
  return "";
}

// Expects ScheduleFromCsv to refuse each (file text, message prefix) case for `shape`, naming `file`.
void ExpectCsvRejections(const std::vector<std::pair<std::string, std::string>>& cases, const std::string& file,
                         const PipelineShape& shape) {
  for (const auto& [text, expected] : cases) {
    try {
      pipeline::ScheduleFromCsv(text, file, shape);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const pipeline::ScheduleError& error) {
      EXPECT_EQ(std::string(error.what()).rfind(expected, 0), 0u) << error.what();
    }
  }
}

std::vector<Action> Parse(const std::vector<std::string>& texts) {
  std::vector<Action> actions;
  for (const auto& text : texts) actions.push_back(pipeline::ParseAction(text));
  return actions;
}

TEST(Action, TextFormRoundTripsForEveryKind) {
  for (const char* text : {"2F0", "0B13", "1I4", "3W2", "0SEND_F7", "1RECV_F0", "12SEND_B3", "4RECV_B11"}) {
    EXPECT_EQ(pipeline::ParseAction(text).ToString(), text);
  }
  const Action action = pipeline::ParseAction("1SEND_B3");
  EXPECT_EQ(action.kind, ActionKind::kSendBackward);
  EXPECT_EQ(action.stage, 1);
  EXPECT_EQ(action.microbatch, 3);
}

TEST(Action, ParseRejectsMalformedText) {
  for (const char* text : {"", "F0", "2F", "2X0", "2SEND0", "a2F0", "2F0x", "2 F0"}) {
    EXPECT_THROW(pipeline::ParseAction(text), pipeline::ScheduleError) << text;
  }
  try {
    pipeline::ParseAction("2X0");
  } catch (const pipeline::ScheduleError& error) {
    EXPECT_NE(std::string(error.what()).find("'2X0' is not an action"), std::string::npos);
  }
}

struct Case {
  std::string schedule;
  int ranks;
  int microbatches;
};

class ScheduleProperties : public ::testing::TestWithParam<std::string> {};

TEST_P(ScheduleProperties, HoldForEveryShapeUpToEightRanksAndSixteenMicrobatches) {
  const std::string name = GetParam();
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE(name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule lowered = pipeline::AddCommunication(pipeline::MakeSchedule(name, {p, 1, m}));
      for (auto semantics : {pipeline::SendSemantics::kBuffered, pipeline::SendSemantics::kRendezvous}) {
        const auto result = pipeline::Simulate(lowered, semantics);
        ASSERT_TRUE(result.ok) << result.error;
        EXPECT_NEAR(result.bubble, static_cast<double>(p - 1) / (m + p - 1), 1e-12);
        EXPECT_EQ(result.peak_in_flight[0], name == "1f1b" ? std::min(p, m) : m);
      }
      // Each stage runs F and B exactly once per microbatch, on its own rank.
      std::map<std::tuple<int, int, int>, int> count;
      for (int rank = 0; rank < p; ++rank) {
        for (const auto& a : lowered.ranks[rank]) {
          ASSERT_EQ(a.stage, rank);
          if (a.IsCompute()) ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
        }
      }
      ASSERT_EQ(count.size(), static_cast<size_t>(2 * p * m));
      for (const auto& [key, n] : count) EXPECT_EQ(n, 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Generators, ScheduleProperties, ::testing::Values("gpipe", "1f1b"));

// Interleaved 1F1B over p <= 8, v <= 4 and every m <= 16 it allows (a multiple of p): valid
// under both send semantics, each stage's F and B once per microbatch on rank s % p, and a
// smaller bubble than 1F1B's on the same ranks and microbatches.
TEST(Interleaved, HoldsForEveryShapeUpToEightRanksFourVirtualStagesSixteenMicrobatches) {
  for (int p = 1; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 16; m += p) {
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        const Schedule lowered = pipeline::LowerSchedule(pipeline::InterleavedSchedule({p, v, m}));
        for (auto semantics : {pipeline::SendSemantics::kBuffered, pipeline::SendSemantics::kRendezvous}) {
          const auto result = pipeline::Simulate(lowered, semantics);
          ASSERT_TRUE(result.ok) << result.error;
        }
        std::map<std::tuple<int, int, int>, int> count;
        for (int rank = 0; rank < p; ++rank) {
          for (const auto& a : lowered.ranks[rank]) {
            ASSERT_EQ(a.stage % p, rank) << a.ToString();
            if (a.IsCompute()) ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
          }
        }
        ASSERT_EQ(count.size(), static_cast<size_t>(2 * p * v * m));
        for (const auto& [key, n] : count) EXPECT_EQ(n, 1);
        // Per unit of work: a stage is 1/v of a rank's model, so compare at equal total work.
        pipeline::CostModel chunk;
        chunk.forward = chunk.backward = 1.0 / v;
        const double interleaved = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, chunk).bubble;
        const double one_f_one_b =
            pipeline::Simulate(pipeline::AddCommunication(pipeline::OneFOneBSchedule({p, 1, m})),
                               pipeline::SendSemantics::kBuffered).bubble;
        if (p > 1) {
          EXPECT_LT(interleaved, one_f_one_b);
        } else {
          EXPECT_EQ(interleaved, 0.0);
        }
      }
    }
  }
}

// F = 1, B = 2 = I + W.
pipeline::CostModel SplitBackwardCosts() {
  pipeline::CostModel costs;
  costs.backward = 2.0;
  costs.backward_input = costs.backward_weight = 1.0;
  return costs;
}

// ZB-H1 over p <= 8, m <= 16: valid under both send semantics, each stage's F, I and W once per
// microbatch (I before W), a peak of in-flight microbatches no higher than 1F1B's, and a smaller
// bubble than 1F1B's when a backward's halves each cost half of it (p > 1).
TEST(ZeroBubbleH1, HoldsForEveryShapeUpToEightRanksAndSixteenMicrobatches) {
  const pipeline::CostModel split = SplitBackwardCosts();
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule lowered = pipeline::LowerSchedule(pipeline::ZeroBubbleH1Schedule({p, 1, m}));
      for (auto semantics : {pipeline::SendSemantics::kBuffered, pipeline::SendSemantics::kRendezvous}) {
        ASSERT_TRUE(pipeline::Simulate(lowered, semantics, split).ok) << pipeline::Simulate(lowered, semantics).error;
      }
      std::map<std::tuple<int, int, int>, int> count;
      for (int rank = 0; rank < p; ++rank) {
        std::map<int, int> step_of_input;
        for (size_t i = 0; i < lowered.ranks[rank].size(); ++i) {
          const auto& a = lowered.ranks[rank][i];
          ASSERT_EQ(a.stage, rank);
          ASSERT_NE(a.kind, ActionKind::kBackward);
          if (a.IsCompute()) ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
          if (a.kind == ActionKind::kBackwardInput) step_of_input[a.microbatch] = static_cast<int>(i);
          if (a.kind == ActionKind::kBackwardWeight) {
            ASSERT_TRUE(step_of_input.count(a.microbatch)) << a.ToString();
          }
        }
      }
      ASSERT_EQ(count.size(), static_cast<size_t>(3 * p * m));
      for (const auto& [key, n] : count) EXPECT_EQ(n, 1);
      const auto zb = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, split);
      const auto one_f_one_b = pipeline::Simulate(pipeline::LowerSchedule(pipeline::OneFOneBSchedule({p, 1, m})),
                                                  pipeline::SendSemantics::kBuffered, split);
      // The pipeline's peak (rank 0's under 1F1B) is never exceeded; later ranks may hold up to it.
      EXPECT_LE(*std::max_element(zb.peak_in_flight.begin(), zb.peak_in_flight.end()),
                *std::max_element(one_f_one_b.peak_in_flight.begin(), one_f_one_b.peak_in_flight.end()));
      if (p > 1) {
        EXPECT_LT(zb.bubble, one_f_one_b.bubble);
      } else {
        EXPECT_EQ(zb.bubble, 0.0);
      }
    }
  }
}

// Each generated schedule's simulated makespan is the one published for its algorithm, for every
// shape up to 8 ranks (m >= p; interleaved with 2 to 4 chunks, m a multiple of p), with F = 1 and
// B = 2 split into I = W = 1. For ZB-H1 at p = 4, m = 8: 8(1 + 1 + 1) + 3(1 + 1 - 1) = 27, bubble 1/9.
TEST(PublishedMakespan, EveryGeneratorMeetsItsAlgorithmsFormula) {
  const pipeline::CostModel costs = SplitBackwardCosts();
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 3 * p + 2; ++m) {
      for (const std::string name : {"gpipe", "1f1b", "zbh1"}) {
        SCOPED_TRACE(name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const Schedule compute = pipeline::MakeSchedule(name, {p, 1, m});
        const auto result = pipeline::Simulate(pipeline::LowerSchedule(compute), pipeline::SendSemantics::kBuffered, costs);
        ASSERT_TRUE(result.ok) << result.error;
        const auto published = pipeline::PublishedMakespan(name, compute.shape, costs);
        ASSERT_TRUE(published.has_value());
        EXPECT_DOUBLE_EQ(result.makespan, *published);
        ++checked;
      }
      for (int v = 2; v <= 4 && m % p == 0; ++v) {
        SCOPED_TRACE("interleaved p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        const Schedule compute = pipeline::InterleavedSchedule({p, v, m});
        const auto result = pipeline::Simulate(pipeline::LowerSchedule(compute), pipeline::SendSemantics::kBuffered, costs);
        ASSERT_TRUE(result.ok) << result.error;
        EXPECT_DOUBLE_EQ(result.makespan, *pipeline::PublishedMakespan("interleaved", compute.shape, costs));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
  std::string formula;
  EXPECT_EQ(pipeline::PublishedMakespan("zbh1", {4, 1, 8}, costs, &formula), 27.0);
  EXPECT_EQ(formula, "m(F + I + W) + (p - 1)(F + I - W) = 8(1 + 1 + 1) + (4 - 1)(1 + 1 - 1) = 27");
  const auto zbh1 = pipeline::Simulate(pipeline::LowerSchedule(pipeline::ZeroBubbleH1Schedule({4, 1, 8})),
                                       pipeline::SendSemantics::kBuffered, costs);
  EXPECT_NEAR(zbh1.bubble, 1.0 - 24.0 / 27.0, 1e-12);
  EXPECT_EQ(zbh1.peak_in_flight, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_FALSE(pipeline::PublishedMakespan("zbv", {4, 2, 8}, costs).has_value());
}

// The registry is the one list of schedules: every entry generates its own placement at its default
// stages per rank, and the scenario loader gives a row that names it (virtual_stages left out)
// that default, from the same entry.
TEST(ScheduleRegistry, EveryEntryGeneratesAndLoadsWithItsDefaults) {
  ASSERT_EQ(pipeline::ScheduleNames().size(), pipeline::ScheduleRegistry().size());
  for (const auto& info : pipeline::ScheduleRegistry()) {
    SCOPED_TRACE(info.name);
    EXPECT_EQ(pipeline::FindSchedule(info.name), &info);
    const Schedule schedule = pipeline::MakeSchedule(info.name, {2, info.default_virtual_stages, 4});
    EXPECT_EQ(schedule.shape.placement, info.placement);
    EXPECT_EQ(schedule.shape.virtual_stages, info.default_virtual_stages);
    const auto suite = harness::ParseSuite("name,schedule,world_size,layers,batch,microbatches\nx," + info.name + ",2,4,8,4\n",
                                           "registry.csv");
    EXPECT_EQ(suite[0].virtual_stages, info.default_virtual_stages);
  }
  EXPECT_EQ(pipeline::FindSchedule("zigzag"), nullptr);
}

// ZB-V over p <= 8, m <= 16: valid under both send semantics, two stages per rank in a V (the
// first and last on rank 0, the V's bottom two on rank p-1), each stage's F, I and W once per
// microbatch, F before I before W, at most 2p stage-microbatches in flight per rank (1F1B's
// peak in layers: a V stage has half a 1F1B stage's), and a smaller bubble than 1F1B's (p > 1).
TEST(ZeroBubbleV, HoldsForEveryShapeUpToEightRanksAndSixteenMicrobatches) {
  const pipeline::CostModel split = SplitBackwardCosts();
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule compute = pipeline::ZeroBubbleVSchedule({p, 2, m});
      ASSERT_EQ(compute.shape.placement, pipeline::Placement::kV);
      EXPECT_EQ(compute.shape.RankOfStage(0), 0);
      EXPECT_EQ(compute.shape.RankOfStage(2 * p - 1), 0);
      EXPECT_EQ(compute.shape.RankOfStage(p - 1), p - 1);
      EXPECT_EQ(compute.shape.RankOfStage(p), p - 1);
      const Schedule lowered = pipeline::LowerSchedule(compute);
      for (auto semantics : {pipeline::SendSemantics::kBuffered, pipeline::SendSemantics::kRendezvous}) {
        ASSERT_TRUE(pipeline::Simulate(lowered, semantics, split).ok) << pipeline::Simulate(lowered, semantics).error;
      }
      std::map<std::tuple<int, int, int>, int> count;
      for (int rank = 0; rank < p; ++rank) {
        std::set<std::pair<int, int>> forward, input;  // (stage, microbatch) done so far
        for (const auto& a : lowered.ranks[rank]) {
          ASSERT_TRUE(a.stage == rank || a.stage == 2 * p - 1 - rank) << a.ToString();
          ASSERT_NE(a.kind, ActionKind::kBackward);
          if (!a.IsCompute()) {
            // Only the V's two bottom stages meet on one rank; nothing between them goes out.
            EXPECT_FALSE(rank == p - 1 && ((a.kind == ActionKind::kSendForward && a.stage == p - 1) ||
                                           (a.kind == ActionKind::kSendBackward && a.stage == p)))
                << a.ToString();
            continue;
          }
          ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
          if (a.kind == ActionKind::kForward) forward.insert({a.stage, a.microbatch});
          if (a.kind == ActionKind::kBackwardInput) {
            ASSERT_TRUE(forward.count({a.stage, a.microbatch})) << a.ToString();
            input.insert({a.stage, a.microbatch});
          }
          if (a.kind == ActionKind::kBackwardWeight) {
            ASSERT_TRUE(input.count({a.stage, a.microbatch})) << a.ToString();
          }
        }
      }
      ASSERT_EQ(count.size(), static_cast<size_t>(3 * 2 * p * m));
      for (const auto& [key, n] : count) EXPECT_EQ(n, 1);
      const auto zbv = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, split);
      for (int rank = 0; rank < p; ++rank) EXPECT_LE(zbv.peak_in_flight[rank], 2 * p);
      // At equal total work: a V stage is half a rank's model.
      pipeline::CostModel half = split;
      half.forward /= 2;
      half.backward_input /= 2;
      half.backward_weight /= 2;
      const double bubble = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, half).bubble;
      const double one_f_one_b = pipeline::Simulate(pipeline::LowerSchedule(pipeline::OneFOneBSchedule({p, 1, m})),
                                                    pipeline::SendSemantics::kBuffered, split).bubble;
      if (p > 1) {
        EXPECT_LT(bubble, one_f_one_b);
      } else {
        EXPECT_EQ(bubble, 0.0);
      }
    }
  }
  EXPECT_THROW(pipeline::ZeroBubbleVSchedule({2, 3, 4}), pipeline::ScheduleError);
  EXPECT_EQ(pipeline::ZeroBubbleVSchedule({2, 1, 4}).shape.virtual_stages, 2);  // 1: the column's default
}

// DualPipeV over p <= 8, 2p <= m <= 3p + 4: valid under both send semantics, two stages per rank
// in a V, each stage's forward once per microbatch and its backward once, whole or split into I
// then W; its bubble does not grow with m (DualPipe's property) and is below 1F1B's at equal work,
// and its makespan is never below the published one (which assumes the F&B pairs overlap). Run
// with each pair in sequence, as pipecheck runs it, its bubble is above ZB-V's (0.054 against
// 0.040 at p = 2, m = 4): DualPipe gains where a pair's forward and backward overlap.
TEST(DualPipeV, HoldsForEveryShapeUpToEightRanks) {
  const pipeline::CostModel split = SplitBackwardCosts();
  for (int p = 1; p <= 8; ++p) {
    double first_idle = -1.0;
    for (int m = 2 * p; m <= 3 * p + 4; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule compute = pipeline::MakeSchedule("dualpipev", {p, 2, m});
      ASSERT_EQ(compute.shape.placement, pipeline::Placement::kV);
      const Schedule lowered = pipeline::LowerSchedule(compute);
      ASSERT_NO_THROW(pipeline::ValidateSchedule(lowered, split, pipeline::CommunicationModel::kDeviceStreams));
      std::map<std::tuple<int, int, int>, int> count;  // (kind, stage, mb): B counted as I and W
      for (int rank = 0; rank < p; ++rank) {
        for (const auto& a : compute.ranks[rank]) {
          ASSERT_TRUE(a.stage == rank || a.stage == 2 * p - 1 - rank) << a.ToString();
          if (a.kind == ActionKind::kBackward) {
            ++count[{static_cast<int>(ActionKind::kBackwardInput), a.stage, a.microbatch}];
            ++count[{static_cast<int>(ActionKind::kBackwardWeight), a.stage, a.microbatch}];
          } else {
            ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
          }
        }
      }
      ASSERT_EQ(count.size(), static_cast<size_t>(3 * 2 * p * m));
      for (const auto& [key, n] : count) EXPECT_EQ(n, 1);
      const auto result = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, split);
      ASSERT_TRUE(result.ok) << result.error;
      const double work = 2 * m * (split.forward + split.backward_input + split.backward_weight);
      if (first_idle < 0) first_idle = result.makespan - work;
      EXPECT_DOUBLE_EQ(result.makespan - work, first_idle);  // the same idle time for every m
      EXPECT_GE(result.makespan, *pipeline::PublishedMakespan("dualpipev", compute.shape, split));
      if (p == 1) continue;
      pipeline::CostModel half = split;  // equal work: a V stage is half a rank's model
      half.forward /= 2, half.backward_input /= 2, half.backward_weight /= 2;
      const double bubble = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, half).bubble;
      const double one_f_one_b = pipeline::Simulate(pipeline::LowerSchedule(pipeline::OneFOneBSchedule({p, 1, m})),
                                                    pipeline::SendSemantics::kBuffered, split).bubble;
      EXPECT_LT(bubble, one_f_one_b);
    }
  }
  // 4 ranks, F = 1, I = W = 1: 48 units of work per rank and 3 idle; published 2 idle.
  std::string formula;
  EXPECT_EQ(pipeline::PublishedMakespan("dualpipev", {4, 2, 8}, split, &formula), 50.0);
  EXPECT_EQ(formula, "2m(F + B) + (p/2 - 1)(F&B + B - 3W), F&B = F + B = 2 x 8(1 + 2) + (4/2 - 1)(3 + 2 - 3 x 1) = 50");
  EXPECT_EQ(pipeline::Simulate(pipeline::LowerSchedule(pipeline::MakeSchedule("dualpipev", {4, 2, 8})),
                               pipeline::SendSemantics::kBuffered, split).makespan, 51.0);
  EXPECT_THROW(pipeline::MakeSchedule("dualpipev", {4, 2, 7}), pipeline::ScheduleError);  // m < 2p
  EXPECT_THROW(pipeline::MakeSchedule("dualpipev", {2, 3, 8}), pipeline::ScheduleError);
  EXPECT_EQ(pipeline::MakeSchedule("dualpipev", {2, 1, 4}).shape.virtual_stages, 2);
}

TEST(Interleaved, RefusesShapesItCannotRun) {
  EXPECT_NE(pipeline::InterleavedConstraint({4, 1, 8}).find("virtual_stages >= 2"), std::string::npos);
  EXPECT_NE(pipeline::InterleavedConstraint({4, 2, 6}).find("multiple of the ranks"), std::string::npos);
  EXPECT_EQ(pipeline::InterleavedConstraint({4, 2, 8}), "");
  EXPECT_THROW(pipeline::InterleavedSchedule({4, 2, 6}), pipeline::ScheduleError);
}

// PyTorch pipelining's compute-only CSV: what we write reads back as the same lists, and a
// hand-written file with I/W, idle cells and spaces reads as written.
TEST(ScheduleCsv, ExportThenImportGivesTheSameLists) {
  for (const auto& [name, shape] : std::vector<std::pair<std::string, PipelineShape>>{
           {"gpipe", {3, 1, 4}}, {"1f1b", {4, 1, 7}}, {"interleaved", {2, 3, 4}}, {"1f1b", {1, 1, 3}}}) {
    const Schedule schedule = pipeline::MakeSchedule(name, shape);
    const Schedule again = pipeline::ScheduleFromCsv(pipeline::ScheduleToCsv(schedule), "x.csv", shape);
    EXPECT_EQ(pipeline::FormatActions(again), pipeline::FormatActions(schedule)) << name;
  }
  // A V schedule's CSV names no placement: it is read back as the V it was.
  const Schedule v = pipeline::MakeSchedule("zbv", {3, 2, 5});
  const Schedule v_again = pipeline::ScheduleFromCsv(pipeline::ScheduleToCsv(v), "v.csv", {3, 2, 5});
  EXPECT_EQ(v_again.shape.placement, pipeline::Placement::kV);
  EXPECT_EQ(pipeline::FormatActions(v_again), pipeline::FormatActions(v));
  const Schedule hand = pipeline::ScheduleFromCsv("0F0, ,0F1,0I0,0W0,0B1\n,1F0,1I0,1F1,1W0,1B1\n", "h.csv", {2, 1, 2});
  EXPECT_EQ(pipeline::FormatActions(hand), "rank 0: 0F0 0F1 0I0 0W0 0B1\nrank 1: 1F0 1I0 1F1 1W0 1B1\n");
}

// PyTorch's compute_comms CSV: pipecheck's lowered lists written with their sends and receives
// read back as the compute schedule they lower from, and lower to the same lists; a message
// between two stages of one rank is refused.
TEST(ScheduleCsv, ComputeCommsFilesCarryPipechecksCommunicationPlan) {
  for (const auto& [name, shape] : std::vector<std::pair<std::string, PipelineShape>>{
           {"1f1b", {2, 1, 4}}, {"zbh1", {3, 1, 6}}, {"interleaved", {2, 2, 4}}, {"zbv", {2, 2, 4}}}) {
    const Schedule compute = pipeline::MakeSchedule(name, shape);
    const Schedule lowered = pipeline::LowerSchedule(compute);
    const std::string text = pipeline::ScheduleToCsv(lowered, pipeline::CsvFormat::kComputeComms);
    EXPECT_NE(text.find("RECV_F"), std::string::npos) << name;
    const Schedule again = pipeline::ScheduleFromCsv(text, "c.csv", shape);
    EXPECT_EQ(pipeline::FormatActions(again), pipeline::FormatActions(compute)) << name;
    EXPECT_EQ(pipeline::FormatActions(pipeline::LowerSchedule(again)), pipeline::FormatActions(lowered)) << name;
  }
  EXPECT_EQ(pipeline::ScheduleToCsv(pipeline::LowerSchedule(pipeline::MakeSchedule("1f1b", {2, 1, 2})),
                                    pipeline::CsvFormat::kComputeComms),
            "0F0,0SEND_F0,0RECV_B0,0F1,0WAIT_SEND_F0,0SEND_F1,0RECV_B1,0B0,0B1,0WAIT_SEND_F1\n"
            "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1WAIT_SEND_B0,1SEND_B1,1WAIT_SEND_B1\n");
  ExpectCsvRejections({{"0F0,0SEND_F0,1F0,0F1,1F1,1B1,0B1,1B0,0B0\n", "l.csv: row 1, cell 2: '0SEND_F0': stages 0 and 1 both "
                                                                       "run on rank 0"}},
                      "l.csv", {1, 2, 2});
  ExpectCsvRejections(
      {{"0F0,0WAIT_SEND_F0,0SEND_F0,0F1,0SEND_F1,0B0,0B1\n1RECV_F0,1RECV_F1,1F0,1F1,1B0,1B1\n",
        "w.csv: row 1, cell 2: '0WAIT_SEND_F0': waits for 0SEND_F0, which this row has not sent"},
       {"0F0,0SEND_F0,0WAIT_SEND_F0,0F1,0SEND_F1,0B0,0B1\n1RECV_F0,1RECV_F1,1F0,1F1,1B0,1B1\n",
        "w.csv: row 1 never waits for 0SEND_F1"},
       {"0F0,0SEND_F0,0WAIT_SEND_F,0F1,0B0,0B1\n1RECV_F0,1F0,1F1,1B0,1B1\n",
        "w.csv: row 1, cell 3: '0WAIT_SEND_F': WAIT_SEND_F needs a microbatch"}},
      "w.csv", {2, 1, 2});
}

// What PyTorch's own schedules write besides F/B/I/W: DualPipeV's OVERLAP_F_B pairs run as their
// two sub-actions in the order written, and REDUCE_GRAD (each stage's gradients final) runs
// nothing but must follow every backward of its stage.
TEST(ScheduleCsv, PyTorchsOverlapAndReduceGradCellsAreRead) {
  const Schedule pairs = pipeline::ScheduleFromCsv(
      "0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2,0REDUCE_GRAD\n1F0,1B0,1F1,1B1,1F2,1B2,1REDUCE_GRAD\n", "p.csv", {2, 1, 3});
  EXPECT_EQ(pipeline::FormatActions(pairs), "rank 0: 0F0 0F1 0F2 0B0 0B1 0B2\nrank 1: 1F0 1B0 1F1 1B1 1F2 1B2\n");
  // PyTorch 2.15 waits for each reduction where its pipeline_order says WAIT_REDUCE_GRAD.
  const Schedule waits = pipeline::ScheduleFromCsv(
      "0F0,0F1,0B0,0B1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n1F0,1B0,1F1,1B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n", "w.csv",
      {2, 1, 2});
  EXPECT_EQ(pipeline::FormatActions(waits), "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0F0,0F1,0B0,0REDUCE_GRAD,0B1\n1F0,1B0,1F1,1B1\n",
       "r.csv: row 1, cell 5: '0B1': comes after 0REDUCE_GRAD (row 1, cell 4)"},
      {"0F0,0F1,0B0,0B1,1REDUCE_GRAD\n1F0,1B0,1F1,1B1\n", "r.csv: row 1, cell 5: '1REDUCE_GRAD': stage 1 runs on rank 1"},
      {"0F0,0F1,0B0,0B1,0REDUCE_GRAD,0REDUCE_GRAD\n1F0,1B0,1F1,1B1\n", "r.csv: row 1, cell 6: '0REDUCE_GRAD': repeats row 1"},
      {"0F0,(0F1;0X0)OVERLAP_F_B,0B1\n1F0,1B0,1F1,1B1\n", "r.csv: row 1, cell 2: '(0F1;0X0)OVERLAP_F_B': sub-action '0X0'"},
      {"0F0,(0F1;0B0;0B1)OVERLAP_F_B\n1F0,1B0,1F1,1B1\n", "r.csv: row 1, cell 2: '(0F1;0B0;0B1)OVERLAP_F_B': OVERLAP_F_B holds 3"},
      {"0F0,(0F1;1B0)OVERLAP_F_B,0B0,0B1\n1F0,1B0,1F1,1B1\n", "r.csv: row 1, cell 2: '(0F1;1B0)OVERLAP_F_B': stage 1 runs on rank 1"},
      {"0F0,0F1,0B0,0B1,0UNSHARD\n1F0,1B0,1F1,1B1\n", "r.csv: row 1, cell 5: '0UNSHARD': not an action"},
      {"0F0,0F1,0B0,0B1,0WAIT_REDUCE_GRAD,0REDUCE_GRAD\n1F0,1B0,1F1,1B1\n",
       "r.csv: row 1, cell 5: '0WAIT_REDUCE_GRAD': waits for stage 0's reduction before its 0REDUCE_GRAD starts it"},
      {"0F0,0F1,0B0,0B1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0WAIT_REDUCE_GRAD\n1F0,1B0,1F1,1B1\n",
       "r.csv: row 1, cell 7: '0WAIT_REDUCE_GRAD': repeats row 1, cell 6"},
  };
  ExpectCsvRejections(cases, "r.csv", {2, 1, 2});
}

// Each broken file names the file, row and cell and the rule it breaks.
// A UTF-8 byte-order mark, as spreadsheets save CSV, is read past, not taken for part of a cell.
TEST(ScheduleCsv, AByteOrderMarkIsReadPast) {
  const PipelineShape shape{2, 1, 2};
  const auto with_mark = pipeline::ScheduleFromCsv("\xEF\xBB\xBF" "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "b.csv", shape);
  const auto without = pipeline::ScheduleFromCsv("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "b.csv", shape);
  EXPECT_EQ(with_mark.ranks, without.ranks);
}

TEST(ScheduleCsv, BrokenFilesAreRejectedNamingRowAndCell) {
  const PipelineShape shape{2, 1, 2};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n1F0\n", "b.csv: 3 rows, but the scenario has 2 ranks"},
      {"0F0,0X1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "b.csv: row 1, cell 2: '0X1': not an action"},
      {"0F0,0F1,0B0,0B1\n1F0,1SEND_F0,1F1,1B0,1B1\n", "b.csv: row 2, cell 2: '1SEND_F0': stage 1 sends to stage 2, "
                                                       "which does not exist"},
      {"0F0,0F1,0B0,0B1\n1F0,0RECV_B0,1F1,1B0,1B1\n", "b.csv: row 2, cell 2: '0RECV_B0': stage 0 runs on rank 0"},
      {"0F0,0F1,0B0,0B1\n1F0,1F1,1B0,2B1\n", "b.csv: row 2, cell 4: '2B1': stage 2 does not exist"},
      {"0F0,1F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "b.csv: row 1, cell 2: '1F1': stage 1 runs on rank 1"},
      {"0F0,0F1,0B0,0B2\n1F0,1F1,1B0,1B1\n", "b.csv: row 1, cell 4: '0B2': microbatch 2 does not exist"},
      {"0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1,1F1\n", "b.csv: row 2, cell 5: '1F1': repeats row 2, cell 2"},
      {"0F0,0F1,0B0,0B1\n1F0,1F1,1B0\n", "b.csv: row 2 lacks 1B1"},
      {"0F0,0F1,0B0,0I1\n1F0,1F1,1B0,1B1\n", "b.csv: row 1 lacks 0W1"},
      {"0F0,0F1,0B0,0B1,0W1\n1F0,1F1,1B0,1B1\n", "b.csv: row 1 has both 0B1 and a split backward"},
  };
  ExpectCsvRejections(cases, "b.csv", shape);
  // Two stages per rank: the first cell that tells the placements apart decides (here 3F0 on
  // rank 0: a V), and a later cell off the V is named with the V's rule.
  try {
    pipeline::ScheduleFromCsv("0F0,3F0,3B0,0B0,2F0\n1F0,2F0,2B0,1B0\n", "v.csv", {2, 2, 1});
    ADD_FAILURE() << "accepted a stage off the V";
  } catch (const pipeline::ScheduleError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("v.csv: row 1, cell 5: '2F0': stage 2 runs on rank 1 (in a V: ", 0), 0u)
        << error.what();
  }
  // Well-formed but impossible: rank 1 runs 1B0 before 1F0; the simulator rejects it.
  const Schedule backwards = pipeline::ScheduleFromCsv("0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n", "b.csv", shape);
  EXPECT_NE(RejectionOf(pipeline::LowerSchedule(backwards)), "");
}

TEST(Schedule, ReceivesArePostedBeforeSendsAndTheComputeAheadOfThem) {
  const Schedule lowered = pipeline::AddCommunication(pipeline::OneFOneBSchedule({2, 1, 4}));
  const std::string text = pipeline::FormatActions(lowered);
  EXPECT_NE(text.find("rank 0: 0F0 0SEND_F0 0RECV_B0 0F1 0SEND_F1 0B0 0RECV_B1 0F2 0SEND_F2 0B1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 1: 1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1RECV_F2 1B1 1SEND_B1"), std::string::npos) << text;
  // Under send_before_recv, neither move is made.
  EXPECT_NE(pipeline::FormatActions(pipeline::AddCommunication(pipeline::OneFOneBSchedule({2, 1, 4}), false))
                .find("rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0"),
            std::string::npos);
}

TEST(Schedule, TheDrainsLastBackwardsSendTheirInputGradientBeforeTheWeights) {
  // 1F1B on two ranks: rank 1's last backward becomes I, its send, then W; nothing else moves.
  const Schedule split = pipeline::SplitDrainBackwards(pipeline::OneFOneBSchedule({2, 1, 4}));
  const std::string text = pipeline::FormatActions(pipeline::AddCommunication(split));
  EXPECT_NE(text.find("rank 0: 0F0 0SEND_F0 0RECV_B0 0F1 0SEND_F1 0B0 0RECV_B1 0F2 0SEND_F2 0B1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("1F3 1I3 1SEND_B3 1W3\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("1B3"), std::string::npos) << text;
  EXPECT_EQ(text.find("0I"), std::string::npos) << text;  // stage 0 sends no input gradient

  const pipeline::CostModel costs{1.0, 2.0, 1.0, 1.0, {}};  // I + W = B
  const auto makespan = [&](const Schedule& schedule) {
    return pipeline::Simulate(pipeline::LowerSchedule(schedule), pipeline::SendSemantics::kBuffered, costs).makespan;
  };
  // Every stage with a remote input, and only its last backward where that is a whole B with a
  // forward just before it, on every generator; the zero-bubble schedules (already split) and a
  // V's local handoff at its bottom stay as they are.
  for (const std::string name : {"gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev", "loopedbfs"}) {
    const auto* info = pipeline::FindSchedule(name);
    ASSERT_NE(info, nullptr) << name;
    const PipelineShape shape{4, info->default_virtual_stages, 8};
    const Schedule whole = pipeline::MakeSchedule(name, shape);
    const Schedule drained = pipeline::SplitDrainBackwards(whole);
    EXPECT_EQ(RejectionOf(pipeline::LowerSchedule(drained)), "") << name;
    for (int r = 0; r < shape.ranks; ++r) {
      std::map<int, Action> last;      // stage -> its last backward (B or I) before the split
      std::map<int, bool> after_f;     // stage -> whether a forward runs just before it
      bool previous_forward = false;
      for (const Action& a : whole.ranks[r]) {
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) {
          last[a.stage] = a;
          after_f[a.stage] = previous_forward;
        }
        previous_forward = a.kind == ActionKind::kForward;
      }
      std::vector<Action> expected;
      for (const Action& a : whole.ranks[r]) {
        const bool remote = a.stage > 0 && shape.RankOfStage(a.stage - 1) != r;
        if (a.kind == ActionKind::kBackward && remote && last.at(a.stage) == a && after_f.at(a.stage)) {
          expected.push_back({ActionKind::kBackwardInput, a.stage, a.microbatch});
          expected.push_back({ActionKind::kBackwardWeight, a.stage, a.microbatch});
        } else {
          expected.push_back(a);
        }
      }
      EXPECT_EQ(pipeline::FormatActions(Schedule{name, shape, {drained.ranks[r]}}),
                pipeline::FormatActions(Schedule{name, shape, {expected}}))
          << name << " rank " << r;
    }
    // With I + W = B, never a longer step; shorter where the drain's receiver waits (1F1B's last
    // stage runs F then B while the stage before it runs one B). Splitting every stage's last B
    // gains nothing more: where backwards run back to back the receiver is busy when the
    // gradient comes.
    Schedule every = whole;
    for (int r = 0; r < shape.ranks; ++r) {
      std::map<int, size_t> last;
      for (size_t i = 0; i < every.ranks[r].size(); ++i) {
        const Action& a = every.ranks[r][i];
        if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) && a.stage > 0 &&
            shape.RankOfStage(a.stage - 1) != r) {
          last[a.stage] = i;
        }
      }
      std::vector<size_t> at;
      for (const auto& [stage, i] : last) {
        if (every.ranks[r][i].kind == ActionKind::kBackward) at.push_back(i);
      }
      std::sort(at.rbegin(), at.rend());
      for (const size_t i : at) {
        every.ranks[r][i].kind = ActionKind::kBackwardInput;
        every.ranks[r].insert(every.ranks[r].begin() + static_cast<std::ptrdiff_t>(i) + 1,
                              Action{ActionKind::kBackwardWeight, every.ranks[r][i].stage, every.ranks[r][i].microbatch});
      }
    }
    EXPECT_LE(makespan(drained), makespan(whole)) << name;
    EXPECT_EQ(makespan(drained), makespan(every)) << name;
    if (name == "1f1b") {
      EXPECT_EQ(makespan(drained), makespan(whole) - 1) << name;
    }
  }
  for (const int p : {2, 3, 8}) {
    const Schedule whole = pipeline::OneFOneBSchedule({p, 1, 2 * p});
    EXPECT_EQ(makespan(pipeline::SplitDrainBackwards(whole)), makespan(whole) - 1) << p;
  }
}

TEST(Schedule, UnknownNameAndVirtualStagesAreRejected) {
  EXPECT_THROW(pipeline::MakeSchedule("zigzag", {2, 1, 4}), pipeline::ScheduleError);
  EXPECT_THROW(pipeline::MakeSchedule("1f1b", {2, 2, 4}), pipeline::ScheduleError);
  EXPECT_THROW(pipeline::MakeSchedule("interleaved", {2, 1, 4}), pipeline::ScheduleError);
  EXPECT_THROW(pipeline::MakeSchedule("gpipe", {2, 1, 0}), pipeline::ScheduleError);
}

// A lowered 2-rank GPipe schedule with 2 microbatches, as text, for hand-breaking.
Schedule TwoRankGPipe(std::vector<std::string> rank0, std::vector<std::string> rank1) {
  return Schedule{"hand", {2, 1, 2}, {Parse(rank0), Parse(rank1)}};
}

const std::vector<std::string> kRank0 = {"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0RECV_B1", "0B0", "0B1"};
const std::vector<std::string> kRank1 = {"1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"};

TEST(Simulator, AcceptsTheHandWrittenBaseline) { EXPECT_EQ(RejectionOf(TwoRankGPipe(kRank0, kRank1)), ""); }

TEST(Simulator, RejectsAMissingBackward) {
  auto rank1 = kRank1;
  rank1.erase(rank1.begin() + 6);  // 1B1
  rank1.pop_back();                // its send
  auto rank0 = kRank0;
  rank0.erase(rank0.begin() + 5);  // the matching receive
  rank0.pop_back();                // 0B1 stays missing too
  EXPECT_NE(RejectionOf(TwoRankGPipe(rank0, rank1)).find("rank 0: missing 0B1"), std::string::npos)
      << RejectionOf(TwoRankGPipe(rank0, rank1));
}

TEST(Simulator, RejectsABackwardBeforeItsForward) {
  auto rank1 = std::vector<std::string>{"1RECV_F0", "1B0", "1F0", "1RECV_F1", "1F1", "1SEND_B0", "1B1", "1SEND_B1"};
  EXPECT_NE(RejectionOf(TwoRankGPipe(kRank0, rank1))
                .find("rank 1 step 1: backward of stage 1 microbatch 0 comes before its forward (step 2)"),
            std::string::npos)
      << RejectionOf(TwoRankGPipe(kRank0, rank1));
}

TEST(Simulator, RejectsASendWithoutItsReceive) {
  auto rank1 = kRank1;
  rank1.erase(rank1.begin() + 2);  // 1RECV_F1
  const std::string error = RejectionOf(TwoRankGPipe(kRank0, rank1));
  EXPECT_NE(error.find("rank 0: a send of stage 0's activation for microbatch 1 has no matching receive"),
            std::string::npos)
      << error;
}

TEST(Simulator, RejectsARepeatedAction) {
  auto rank0 = kRank0;
  rank0.push_back("0B1");
  EXPECT_NE(RejectionOf(TwoRankGPipe(rank0, kRank1)).find("rank 0 step 8 (0B1): repeated (first at step 7)"),
            std::string::npos);
}

TEST(Simulator, RejectsAnActionOnTheWrongRank) {
  auto rank0 = kRank0;
  rank0.push_back("1W0");
  EXPECT_NE(RejectionOf(TwoRankGPipe(rank0, kRank1)).find("rank 0 step 8 (1W0): stage 1 runs on rank 1"),
            std::string::npos);
}

TEST(Simulator, RejectsACycleWithTheGridMarkingWhereEachRankStopped) {
  // Rank 0 waits for microbatch 1's gradient before sending microbatch 1's activation.
  auto rank0 = std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0RECV_B0", "0RECV_B1", "0B0", "0B1", "0SEND_F1"};
  const std::string error = RejectionOf(TwoRankGPipe(rank0, kRank1));
  EXPECT_NE(error.find("deadlock: no rank can take its next step"), std::string::npos) << error;
  EXPECT_NE(error.find("waiting: rank 0 step 5 (0B0), rank 1 step 3 (1F1)"), std::string::npos) << error;
  EXPECT_NE(error.find(">0B0<"), std::string::npos) << error;
  EXPECT_NE(error.find(">1F1<"), std::string::npos) << error;
}

TEST(Simulator, RejectsSendsBeforeReceivesOnlyWhenSendsWaitForReceives) {
  // Both ranks send before posting their receives: fine with buffered sends, a deadlock
  // when a send blocks until the matching receive is posted.
  auto rank0 = std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0RECV_B1", "0B0", "0B1"};
  auto rank1 = std::vector<std::string>{"1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"};
  const Schedule schedule = TwoRankGPipe(rank0, rank1);
  EXPECT_TRUE(pipeline::Simulate(schedule, pipeline::SendSemantics::kBuffered).ok);
  const auto rendezvous = pipeline::Simulate(schedule, pipeline::SendSemantics::kRendezvous);
  EXPECT_FALSE(rendezvous.ok);
  EXPECT_NE(rendezvous.error.find("waiting: rank 0 step 3 (0SEND_F1), rank 1 step 3 (1SEND_B0)"), std::string::npos)
      << rendezvous.error;
  EXPECT_NE(RejectionOf(schedule).find("when sends wait for receives"), std::string::npos);
}

// NCCL's device streams (SendSemantics::kDeviceStreams): one channel per ordered pair of ranks.
// The host lowering's crossing exchange (1F1B at p=2: each rank posts its receive from the other
// before its own send) runs there, since a receive holds only its own channel; on one stream per
// rank shared by both directions it would not.
TEST(DeviceStreams, AReceivePostedEarlyHoldsOnlyItsOwnChannel) {
  const auto rank0 = std::vector<std::string>{"0F0", "0SEND_F0", "0RECV_B0", "0F1", "0SEND_F1", "0B0", "0RECV_B1", "0B1"};
  const auto rank1 = std::vector<std::string>{"1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"};
  const Schedule crossing = TwoRankGPipe(rank0, rank1);
  const auto host = pipeline::Simulate(crossing, pipeline::SendSemantics::kBuffered);
  const auto streams = pipeline::Simulate(crossing, pipeline::SendSemantics::kDeviceStreams);
  ASSERT_TRUE(host.ok) << host.error;
  ASSERT_TRUE(streams.ok) << streams.error;
  EXPECT_EQ(streams.makespan, host.makespan);
  EXPECT_EQ(streams.start_times, host.start_times);
  EXPECT_NO_THROW(pipeline::ValidateSchedule(crossing, {}, pipeline::CommunicationModel::kDeviceStreams));
  EXPECT_EQ(pipeline::PeerOf(crossing.shape, pipeline::ParseAction("1SEND_B0")), 0);
  EXPECT_EQ(pipeline::PeerOf(crossing.shape, pipeline::ParseAction("0RECV_B0")), 1);
  EXPECT_EQ(pipeline::PeerOf(crossing.shape, pipeline::ParseAction("1F0")), -1);
}

// A channel carries its messages in order: a receive posted ahead of the one before it on the
// same channel waits for a send that waits for that earlier receive (NCCL would hand over the
// wrong tensor; the order check names it first).
TEST(DeviceStreams, ReceivesOutOfTheirChannelsOrderDeadlock) {
  const auto rank0 = std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"};
  const auto rank1 = std::vector<std::string>{"1RECV_F1", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"};
  const Schedule swapped = TwoRankGPipe(rank0, rank1);
  const auto streams = pipeline::Simulate(swapped, pipeline::SendSemantics::kDeviceStreams);
  ASSERT_FALSE(streams.ok);
  EXPECT_NE(streams.error.find("deadlock on the device streams"), std::string::npos) << streams.error;
  EXPECT_NE(streams.error.find("rank 1 step 0 (1RECV_F1) has started; its other end rank 0 step 3 (0SEND_F1) has not"),
            std::string::npos)
      << streams.error;
  try {
    pipeline::ValidateSchedule(swapped, {}, pipeline::CommunicationModel::kDeviceStreams);
    FAIL() << "receives out of order were accepted";
  } catch (const pipeline::ScheduleError& error) {
    EXPECT_NE(std::string(error.what()).find("matched by order"), std::string::npos) << error.what();
  }
}

// Every generated schedule, lowered once for every transport, runs on NCCL's channels in the
// time the host model gives it (communication free in both), on every shape.
TEST(DeviceStreams, EveryScheduleRunsOnChannelsInTheHostModelsTime) {
  const pipeline::CostModel split = SplitBackwardCosts();
  int shapes = 0;
  for (const std::string& name : pipeline::ScheduleNames()) {
    for (int p = 1; p <= 6; ++p) {
      for (int v : {1, 2}) {
        for (int m = 1; m <= 12; ++m) {
          Schedule compute;
          try {
            compute = pipeline::MakeSchedule(name, {p, v, m});
          } catch (const pipeline::ScheduleError&) {
            continue;  // a shape this generator does not serve
          }
          SCOPED_TRACE(name + " p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
          ++shapes;
          const Schedule lowered = pipeline::LowerSchedule(compute);
          ASSERT_NO_THROW(pipeline::ValidateSchedule(lowered, split, pipeline::CommunicationModel::kDeviceStreams));
          const auto streams = pipeline::Simulate(lowered, pipeline::SendSemantics::kDeviceStreams, split);
          ASSERT_TRUE(streams.ok) << streams.error;
          const auto host = pipeline::Simulate(lowered, pipeline::SendSemantics::kBuffered, split);
          if (name == "loopedbfs") {
            // Every microbatch of a stage in flight at once on one ordered channel: a send waits
            // behind earlier ones its receiver takes later (p >= 2, two stages per rank, m
            // past p + 2 or so: up to a few units longer). It runs; it is not as fast.
            EXPECT_GE(streams.makespan, host.makespan - 1e-9);
          } else {
            EXPECT_NEAR(streams.makespan, host.makespan, 1e-9);
          }
        }
      }
    }
  }
  EXPECT_EQ(shapes, 605);
}

}  // namespace
}  // namespace pipecheck

