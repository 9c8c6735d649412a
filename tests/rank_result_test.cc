// Rank results travel to rank 0 column by column under each field's name: a round trip keeps every
// field, and a field added in the middle of a record's table cannot shift the others.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pipeline/rank_result.h"
#include "pipeline/record_columns.h"

namespace pipecheck::pipeline {
namespace {

struct Sample {
  int64_t id = 0;
  double middle = 0.0;
  double time = 0.0;
};

std::vector<RecordField<Sample>> Before() {
  return {WholeField<Sample>("id", [](const Sample& s) { return s.id; }, [](Sample& s, int64_t v) { s.id = v; }),
          RealField<Sample>("time", [](const Sample& s) { return s.time; }, [](Sample& s, double v) { s.time = v; })};
}

// The same record with a field inserted between the two.
std::vector<RecordField<Sample>> After() {
  auto fields = Before();
  fields.insert(fields.begin() + 1, RealField<Sample>("middle", [](const Sample& s) { return s.middle; },
                                                      [](Sample& s, double v) { s.middle = v; }));
  return fields;
}

TEST(RecordColumns, AFieldAddedInTheMiddleShiftsNoOther) {
  const std::vector<Sample> records = {{7, 0.5, 1.25}, {(int64_t{1} << 60) + 3, -2.0, 3.5}};
  const auto packed = PackRecords(records, After());
  const auto same = UnpackRecords(packed, After(), "samples");
  ASSERT_EQ(same.size(), 2u);
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(same[i].id, records[i].id);  // int64 exactly, past float64's 2^53
    EXPECT_EQ(same[i].middle, records[i].middle);
    EXPECT_EQ(same[i].time, records[i].time);
  }
  // A reader without the new field reads the rest by name, not by position.
  const auto older = UnpackRecords(packed, Before(), "samples");
  ASSERT_EQ(older.size(), 2u);
  EXPECT_EQ(older[1].id, records[1].id);
  EXPECT_EQ(older[1].time, records[1].time);
  EXPECT_EQ(older[1].middle, 0.0);
  // A reader expecting a field the bytes lack names it.
  try {
    UnpackRecords(PackRecords(records, Before()), After(), "samples");
    FAIL() << "a missing column was read";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "samples: no column 'middle' in the packed records");
  }
}

TEST(RecordColumns, ColumnsOfUnequalLengthAreRefused) {
  auto packed = PackRecords(std::vector<Sample>{{1, 2.0, 3.0}}, Before());
  packed.insert_or_assign("time", torch::zeros({2}, torch::kFloat64));
  EXPECT_THROW(UnpackRecords(packed, Before(), "samples"), std::runtime_error);
  packed.insert_or_assign("time", torch::zeros({1}, torch::kInt64));
  EXPECT_THROW(UnpackRecords(packed, Before(), "samples"), std::runtime_error);
}

TEST(RankResults, RoundTripKeepsEveryField) {
  RankResult in;
  in.rank = 2;
  in.replica = 1;
  in.replicas = 3;
  in.stages = {2, 5};
  in.losses = {std::nan(""), 1.5};
  in.step_ms = {10.0, 11.0};
  in.timing_step_ms = {9.0, 9.5, 9.25};
  in.grad_norms = {0.25, 0.125};
  in.peak_bytes = {-1, int64_t{1} << 40};
  reference::NamedTensors step;
  step.insert("layers.2.w", torch::arange(6, torch::kFloat64).reshape({2, 3}));
  in.gradients = {step, step};
  in.weights = {step, step};
  in.master_weights = {step};
  in.final_weights = step;
  in.timeline.push_back({1, Action{ActionKind::kBackwardInput, 5, 3}, 1.5, 2.5, (int64_t{1} << 55) + 1, 77, 1.0, 123.0});
  BoundaryRecord boundary{1, 3, 5, Direction::kGradient, BoundaryRole::kSent, 1, {}};
  boundary.fingerprint = {1.0, 2.0, 3.0, 4.0, 24, 2, true, 0xfedcba9876543210ull};
  in.boundaries.push_back(boundary);
  in.messages.push_back({1, false, 1, 42, MessageShape{torch::kBFloat16, {2, 16, 32}}, 2048});
  in.messages.push_back({1, false, 3, 43, MessageShape{torch::kFloat32, {}}, -1});
  in.collectives.push_back({1, 100, 800, 3, 4.0, 5.0, 6.0});

  const RankResult out = DeserializeRankResult(SerializeRankResult(in));
  EXPECT_EQ(out.rank, 2);
  EXPECT_EQ(out.replica, 1);
  EXPECT_EQ(out.replicas, 3);
  EXPECT_EQ(out.stages, in.stages);
  ASSERT_EQ(out.losses.size(), 2u);
  EXPECT_TRUE(std::isnan(out.losses[0]));
  EXPECT_EQ(out.losses[1], 1.5);
  EXPECT_EQ(out.step_ms, in.step_ms);
  EXPECT_EQ(out.timing_step_ms, in.timing_step_ms);
  EXPECT_EQ(out.grad_norms, in.grad_norms);
  EXPECT_EQ(out.peak_bytes, in.peak_bytes);
  ASSERT_EQ(out.gradients.size(), 2u);
  EXPECT_TRUE(torch::equal(out.gradients[1]["layers.2.w"], step["layers.2.w"]));
  ASSERT_EQ(out.weights.size(), 2u);
  ASSERT_EQ(out.master_weights.size(), 1u);
  EXPECT_TRUE(torch::equal(out.final_weights["layers.2.w"], step["layers.2.w"]));

  ASSERT_EQ(out.timeline.size(), 1u);
  const auto& t = out.timeline[0];
  EXPECT_EQ(t.step, 1);
  EXPECT_EQ(t.action.kind, ActionKind::kBackwardInput);
  EXPECT_EQ(t.action.stage, 5);
  EXPECT_EQ(t.action.microbatch, 3);
  EXPECT_EQ(t.start_us, 1.5);
  EXPECT_EQ(t.end_us, 2.5);
  EXPECT_EQ(t.held_bytes, (int64_t{1} << 55) + 1);
  EXPECT_EQ(t.peak_bytes, 77);
  EXPECT_EQ(t.wait_start_us, 1.0);
  EXPECT_EQ(t.step_start_us, 123.0);

  ASSERT_EQ(out.boundaries.size(), 1u);
  const auto& b = out.boundaries[0];
  EXPECT_EQ(b.step, 1);
  EXPECT_EQ(b.microbatch, 3);
  EXPECT_EQ(b.stage, 5);
  EXPECT_EQ(b.direction, Direction::kGradient);
  EXPECT_EQ(b.role, BoundaryRole::kSent);
  EXPECT_EQ(b.peer, 1);
  EXPECT_EQ(b.fingerprint.sum, 1.0);
  EXPECT_EQ(b.fingerprint.norm, 2.0);
  EXPECT_EQ(b.fingerprint.max_abs, 3.0);
  EXPECT_EQ(b.fingerprint.row_weighted_sum, 4.0);
  EXPECT_EQ(b.fingerprint.numel, 24);
  EXPECT_EQ(b.fingerprint.rows, 2);
  EXPECT_TRUE(b.fingerprint.hashed);
  EXPECT_EQ(b.fingerprint.hash, 0xfedcba9876543210ull);

  ASSERT_EQ(out.messages.size(), 2u);
  EXPECT_EQ(out.messages[0].step, 1);
  EXPECT_FALSE(out.messages[0].send);
  EXPECT_EQ(out.messages[0].peer, 1);
  EXPECT_EQ(out.messages[0].tag, 42);
  EXPECT_EQ(out.messages[0].shape.dtype, torch::kBFloat16);
  EXPECT_EQ(out.messages[0].shape.sizes, (std::vector<int64_t>{2, 16, 32}));
  EXPECT_EQ(out.messages[0].bytes, 2048);
  EXPECT_TRUE(out.messages[1].shape.sizes.empty());
  EXPECT_EQ(out.messages[1].bytes, -1);

  ASSERT_EQ(out.collectives.size(), 1u);
  const auto& c = out.collectives[0];
  EXPECT_EQ(c.step, 1);
  EXPECT_EQ(c.elements, 100);
  EXPECT_EQ(c.bytes, 800);
  EXPECT_EQ(c.replicas, 3);
  EXPECT_EQ(c.start_us, 4.0);
  EXPECT_EQ(c.end_us, 5.0);
  EXPECT_EQ(c.step_start_us, 6.0);
}

}  // namespace
}  // namespace pipecheck::pipeline
