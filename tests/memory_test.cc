// Memory, measured on real ranks beside the memory model's prediction: every rank's peak within
// 10% of predicted; GPipe's stage 0 holds activations for all m microbatches while 1F1B's holds
// them for min(p, m); and a sent activation's buffer is released as soon as the next message to
// the same peer goes, not at the step's end (read from the counting allocator after each action).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "harness/launcher.h"
#include "harness/preflight.h"
#include "harness/scenario_model.h"
#include "pipeline/memory_model.h"
#include "pipeline/stage.h"
#include "pipeline/transport.h"
#include "reference/data.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

constexpr const char* kHeader =
    "name,flavor,dtype,world_size,schedule,partition,tied,layers,hidden,heads,batch,microbatches,seq_len,seq_len_min,"
    "vocab\n";

// `row` in `header`'s columns (kHeader's by default; there vocab may be left off: 256).
reports::ScenarioReport Launch(std::string row, const std::string& header = kHeader) {
  const std::string name = row.substr(0, row.find(','));
  if (header == kHeader && std::count(row.begin(), row.end(), ',') == 13) row += ",";
  const std::string suite = testing::ScratchDirectory("memory_" + name) + "/suite.csv";
  std::ofstream(suite) << header << row << "\n";
  const auto report =
      harness::LaunchScenario(harness::LoadSuite(suite)[0], testing::TestLaunchOptions("memory_" + name + "_work"));
  EXPECT_EQ(report.summary.status, reports::Status::kPass) << name << ": " << report.summary.message;
  return report;
}

// A measured or predicted byte count the test needs: its absence fails the test.
int64_t Bytes(const std::optional<int64_t>& bytes) {
  EXPECT_TRUE(bytes.has_value());
  return bytes.value_or(0);
}

int64_t RankPeak(const reports::ScenarioReport& report, int rank) { return Bytes(report.ranks.at(rank).peak_bytes); }

// Measured over predicted peak: of a rank over the run, of an action (a timeline.csv row).
double RankPeakRatio(const reports::ScenarioReport& report, int rank) {
  const int64_t predicted = Bytes(report.ranks.at(rank).peak_bytes_predicted);
  return static_cast<double>(RankPeak(report, rank)) / static_cast<double>(predicted);
}
double ActionPeakRatio(const reports::TimelineRow& event) {
  return static_cast<double>(Bytes(event.peak_bytes)) / static_cast<double>(Bytes(event.peak_bytes_predicted));
}

// Expects every action of `rank` (any rank where empty) whose kind `tolerance` lists to peak
// within that fraction of predicted; returns how many it checked.
int ExpectActionPeaksNear(const reports::ScenarioReport& report, const std::string& rank,
                          const std::map<std::string, double>& tolerance) {
  int checked = 0;
  for (const auto& event : report.timeline) {
    const auto kind = tolerance.find(event.action);
    if (kind == tolerance.end() || (!rank.empty() && std::to_string(event.rank) != rank)) continue;
    EXPECT_NEAR(ActionPeakRatio(event), 1.0, kind->second)
        << event.scenario << ": " << kind->first << event.stage << "," << event.microbatch << " rank "
        << event.rank << " step " << event.step;
    ++checked;
  }
  return checked;
}

// Every rank of `report` (scenario `row`) peaks within 10% of its predicted peak.
void ExpectEveryRankWithinTenPercent(const reports::ScenarioReport& report, const std::string& row) {
  ASSERT_FALSE(report.ranks.empty()) << row;
  for (const auto& rank : report.ranks) {
    const double measured = static_cast<double>(Bytes(rank.peak_bytes));
    const double predicted = static_cast<double>(Bytes(rank.peak_bytes_predicted));
    EXPECT_LT(std::abs(measured / predicted - 1.0), 0.10) << row << " rank " << rank.rank << ": measured " << measured
                                                         << ", predicted " << predicted;
  }
}

TEST(Memory, EveryRanksPeakIsWithinTenPercentOfPredicted) {
  for (const std::string row : {"llama_1f1b,llama,float32,2,1f1b,uniform,0,4,64,4,8,4,32,",
                                "gpt2_gpipe_tied_bf16,gpt2,bfloat16,2,gpipe,uniform,1,4,64,4,8,4,32,12",
                                "llama_empty_f64,llama,float64,4,1f1b,2;0;1;1,0,4,32,4,6,3,24,8",
                                "gpt2_params_ws3,gpt2,float32,3,1f1b,params,0,6,64,4,12,6,32,20",
                                // The peak inside a zero-bubble I, which keeps the whole graph for
                                // W, on stages whose attention scores dwarf the rest.
                                "zbh1_scores_f64,llama,float64,3,zbh1,params,1,6,32,4,2,1,128,,64",
                                // A tied weight's copy on the last rank is not squared by the
                                // clip; it dominates this bfloat16 rank's parameters.
                                "tied_copy_bf16,gpt2,bfloat16,3,1f1b,params,1,4,64,4,1,1,16,4,1000"}) {
    const auto report = Launch(row);
    ExpectEveryRankWithinTenPercent(report, row);
    EXPECT_TRUE(report.summary.pp_peak_bytes_predicted.has_value());
  }
}

// A mixture of experts' layers keep what their router and the experts their tokens chose save
// (pipeline/memory_model.cc MlpRetained): every rank's peak within 10% of predicted, as a dense
// layer's, over the routers, dtypes, a shared expert, dense first layers, padding (variable
// lengths, which is not dispatched), the balance loss and recomputation.
TEST(Memory, AMixtureOfExpertsRanksPeakIsWithinTenPercentOfPredicted) {
  const std::string header =
      "name,flavor,dtype,world_size,schedule,layers,hidden,heads,experts,top_k,dense_layers,shared_experts,expert_ffn,"
      "router,aux_loss,batch,microbatches,seq_len,seq_len_min,recompute\n";
  for (const std::string row : {"moe_f64_varlen,llama,float64,2,1f1b,4,32,4,4,2,1,0,,softmax,0.01,8,4,32,8,0",
                                "moe_f32_shared_sigmoid,llama,float32,2,gpipe,4,64,4,8,2,0,1,48,sigmoid,0.01,8,4,32,,0",
                                "moe_bf16_top1,llama,bfloat16,2,1f1b,4,64,4,4,1,0,0,,softmax,0,8,4,32,12,0",
                                "moe_f32_recompute,llama,float32,2,1f1b,4,64,4,4,2,0,0,,softmax,0.01,8,4,32,,1"}) {
    const auto report = Launch(row, header);
    ExpectEveryRankWithinTenPercent(report, row);
  }
}

// Microbatches of 2 sequences of 128 positions whatever m is, so one microbatch's activations
// are the same size in every run, on a narrow model (hidden 32) whose activations dwarf its
// parameters and gradients: stage 0's peak then grows with what its schedule keeps. (Under
// 1F1B with m > p, gradients exist while p microbatches are in flight; with m = p they do not
// yet. Here they are a tenth of one microbatch.)
TEST(Memory, GPipeKeepsEveryMicrobatchOneFOneBKeepsMinPM) {
  std::map<std::string, std::map<int, int64_t>> peak;  // schedule -> m -> rank 0's peak
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    for (int m : {2, 4, 8}) {
      const auto report = Launch(fmt::format("{}_m{},llama,float32,2,{},uniform,0,2,32,4,{},{},128,", schedule, m,
                                             schedule, 2 * m, m));
      peak[schedule][m] = RankPeak(report, 0);
      EXPECT_LT(std::abs(static_cast<double>(peak[schedule][m]) / Bytes(report.ranks.at(0).peak_bytes_predicted) - 1), 0.10);
    }
  }
  // One microbatch's activations on stage 0, from GPipe's growth between m = 2 and m = 8.
  const double per_microbatch = static_cast<double>(peak["gpipe"][8] - peak["gpipe"][2]) / 6.0;
  ASSERT_GT(per_microbatch, 500e3);  // 2 x 128 tokens, 4 heads of 128 x 128 scores: about 1 MB
  EXPECT_NEAR(static_cast<double>(peak["gpipe"][4] - peak["gpipe"][2]), 2 * per_microbatch, 0.1 * 2 * per_microbatch);
  // 1F1B with p = 2 keeps at most 2 microbatches on stage 0 whatever m is.
  EXPECT_LT(std::abs(static_cast<double>(peak["1f1b"][8] - peak["1f1b"][2])), 0.25 * per_microbatch);
  EXPECT_LT(std::abs(static_cast<double>(peak["1f1b"][4] - peak["1f1b"][2])), 0.25 * per_microbatch);
}

TEST(Memory, ASentActivationIsReleasedWhenTheNextSendGoesNotAtStepEnd) {
  const auto report = Launch("released,llama,float32,2,gpipe,uniform,0,2,64,4,8,4,32,");
  // Rank 0 of GPipe in step 1: F0 SEND_F0 F1 SEND_F1 ... Each SEND_F k (k >= 1) first waits for
  // the previous activation's send and releases its buffer: one activation (2 x 32 x 64 float32)
  // less held than after the action before it (its 80-byte header goes, the new one comes).
  constexpr int64_t kActivation = 2 * 32 * 64 * 4;
  int64_t before = -1;
  int checked = 0;
  std::optional<int64_t> offset;  // measured - predicted after the step's first action
  for (const auto& event : report.timeline) {
    if (event.rank != 0 || event.step != 1) continue;
    const int64_t held = Bytes(event.held_bytes);
    if (event.action == "SEND_F" && event.microbatch != 0) {
      EXPECT_EQ(before - held, kActivation) << "SEND_F" << event.microbatch;
      ++checked;
    }
    // And the model follows the allocator through the step, action by action. Measured from the
    // step's first action: once in a loaded CI run rank 0 held 72 bytes more than predicted from
    // before step 1 began to its end (something small still referenced from step 0); what this
    // test pins is the accounting within the step.
    const int64_t difference = held - Bytes(event.held_bytes_predicted);
    if (!offset) offset = difference;
    EXPECT_NEAR(static_cast<double>(difference), static_cast<double>(*offset), 64.0)
        << event.action << event.microbatch;
    before = held;
  }
  ASSERT_TRUE(offset.has_value());
  EXPECT_LE(std::abs(*offset), 128) << "after step 1's first action, held minus predicted";
  EXPECT_EQ(checked, 3);
}

// timeline.csv's per-action peaks: what the allocator saw at most during each action, and what
// the model says. A zero-bubble schedule on attention-heavy stages, so the rank's peak is inside
// an I: the model must place it there, to the byte's neighbourhood, not only match its size.
TEST(Memory, EachActionsPeakIsMeasuredAndPredicted) {
  const auto report = Launch("action_peaks,llama,float64,3,zbh1,params,0,6,32,4,4,2,128,,64");
  std::map<int, int64_t> highest;  // rank -> the highest action peak
  int inputs_checked = 0;
  std::map<std::pair<int, int64_t>, int64_t> held_before;  // (rank, step) -> after its previous action
  for (const auto& event : report.timeline) {
    const int rank = static_cast<int>(event.rank);
    const int64_t held = Bytes(event.held_bytes), peak = Bytes(event.peak_bytes);
    const int64_t predicted = Bytes(event.peak_bytes_predicted);
    const std::string what = fmt::format("{}{},{} rank {} step {}", event.action, event.stage, event.microbatch,
                                         event.rank, event.step);
    // A peak is at least what was held when the action began and when it ended.
    EXPECT_GE(peak, held) << what;
    const auto key = std::make_pair(rank, event.step);
    if (held_before.count(key)) {
      EXPECT_GE(peak, held_before[key]) << what;
    }
    EXPECT_GE(predicted, Bytes(event.held_bytes_predicted)) << what;
    held_before[key] = held;
    highest[rank] = std::max(highest[rank], peak);
    if (event.action == "I" && event.stage != 0) {
      EXPECT_NEAR(static_cast<double>(peak) / static_cast<double>(predicted), 1.0, 0.02) << what;
      ++inputs_checked;
    }
    if (event.action == "I" && event.stage == 0) {
      // Stage 0's I computes nothing: above what it ends with, only the received gradient's copy
      // out of its message buffer (2 x 128 x 32 float64) and the buffer's header, which goes.
      constexpr int64_t kGradient = 2 * 128 * 32 * 8;
      EXPECT_LE(peak - held, kGradient + pipeline::kMessageHeaderBytes + 256) << what << ": stage 0's I computes nothing";
      EXPECT_NEAR(static_cast<double>(peak) / static_cast<double>(predicted), 1.0, 0.02) << what;
    }
  }
  EXPECT_EQ(inputs_checked, 2 * 2 * 2);  // stages 1 and 2, two microbatches, two steps
  ASSERT_EQ(report.ranks.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    // The step's peak is the highest of its actions' or of the end of step's (tied sum, clip, update).
    EXPECT_LE(highest[rank], RankPeak(report, rank)) << "rank " << rank;
  }
  // Stages 1 and 2 peak inside an I.
  EXPECT_EQ(highest[1], RankPeak(report, 1));
  EXPECT_EQ(highest[2], RankPeak(report, 2));
}

// A later backward of a stage adds each fresh parameter gradient into the existing .grad in
// place. On ATen's product (float64 here) the fresh one is a temporary beside the op's activation
// gradients (an MLP weight of 256 x 768 doubles, 1.5 MB, on stages whose microbatches keep about
// as much); a float32 layer on oneDNN adds its product straight into .grad
// (reference::FusedWeightGradients) and makes none, which the model follows too. GPipe.
TEST(Memory, ALaterBackwardsFreshGradientsArePredicted) {
  for (const char* dtype : {"float64", "float32"}) {
    const auto report = Launch(fmt::format("fresh_grads,gpt2,{},3,gpipe,params,1,3,256,8,8,4,32,8", dtype));
    int checked = 0;
    for (const auto& event : report.timeline) {
      if (event.action != "B" || event.microbatch == 0) continue;
      EXPECT_NEAR(ActionPeakRatio(event), 1.0, 0.04)
          << dtype << " B" << event.stage << "," << event.microbatch << " step " << event.step;
      ++checked;
    }
    EXPECT_EQ(checked, 3 * 3 * 2) << dtype;  // 3 stages, microbatches 1-3, 2 steps
  }
}

// On a stage's last layer, the attention's score-sized tensors come while its MLP's and the
// head's saved tensors do not exist yet (forward) or are already gone (backward): neither action
// peaks at everything saved plus the scores. Attention-heavy (4 heads of 128 x 128 scores over
// hidden 64) in float64 on 3 ranks; counting the scores on top of everything put F and B about
// 10% above measured.
TEST(Memory, ScoresComeWhileTheLastLayersLaterSavesAreAbsent) {
  const auto report = Launch("scores_apart,gpt2,float64,3,1f1b,uniform,0,6,64,4,4,2,128,,64");
  // 3 stages, F and B, 2 microbatches, 2 steps; the last stage runs microbatch 1's backward as I
  // and W (the trainer's drain split), one more action a step
  EXPECT_EQ(ExpectActionPeaksNear(report, "", {{"F", 0.03}, {"B", 0.06}, {"I", 0.06}, {"W", 0.06}}),
            3 * 2 * 2 * 2 + 2);
}

// A last stage that holds the head alone (one layer over two ranks puts it on stage 0), with a
// vocabulary smaller than the hidden size: the final norm's backward, not the logits', makes
// each backward's peak. I keeps every tensor the norm's ops saved and peaked 5x above the
// logits' two gradients that were all the model counted (rank 1 at +22..48%); B holds fewer
// of them. gpt2 in float32, I and W (zbh1), then B (1f1b: the first microbatch's; the second's
// is the drain's, split into I and W by the trainer).
TEST(Memory, AHeadOnlyStagesBackwardPeaksInItsNorm) {
  for (const std::string schedule : {"zbh1", "1f1b"}) {
    const auto report =
        Launch("head_only_" + schedule + ",gpt2,float32,2," + schedule + ",uniform,0,1,128,2,4,2,64,,32");
    // B within 4%: three (n, h) norm gradients at its height fit hidden 128 to 0.1% here; at
    // hidden 64 the model is 3-5% above measured, at 256 2% below (LibTorch 2.11).
    const int checked = ExpectActionPeaksNear(report, "1", {{"F", 0.03}, {"I", 0.03}, {"W", 0.03}, {"B", 0.04}});
    EXPECT_EQ(checked, (schedule == "zbh1" ? 6 : 5) * 2);  // F, I, W twice (F, B, F, I, W), 2 steps
    ASSERT_EQ(report.ranks.size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_NEAR(RankPeakRatio(report, rank), 1.0, 0.10) << schedule << " rank " << rank;
    }
  }
}

// Few tokens (8 per microbatch) beside a wide vocabulary and hidden (256 each): a head-only
// stage's backward peaks in the output projection's, where the weight's gradient (256 KB in
// float32) stands beside the input's. The model had only the logits' gradients (8 KB) there: a
// later backward peaked 40% above predicted. GPipe, two microbatches, the second accumulating.
TEST(Memory, TheHeadsProjectionGradientStandsBesideItsInputs) {
  const auto report = Launch("projection_grad,gpt2,float32,2,gpipe,uniform,0,1,256,2,2,2,8,,256");
  EXPECT_EQ(ExpectActionPeaksNear(report, "1", {{"B", 0.03}}), 2 * 2);  // 2 microbatches, 2 steps
}

// An empty stage (2 layers over 4 ranks) passes activations and gradients through and owns no
// weights: its W runs nothing. The model had it recompute an input gradient, 27% above the
// rank's measured peak. Zero-bubble H1 in float64, six microbatches.
TEST(Memory, AnEmptyStagesWeightPassRunsNothing) {
  const auto report = Launch("empty_w,llama,float64,4,zbh1,uniform,1,2,128,4,12,6,16,4,32");
  EXPECT_EQ(ExpectActionPeaksNear(report, "2", {{"W", 0.01}}), 6 * 2);  // 6 microbatches, 2 steps
  ASSERT_EQ(report.ranks.size(), 4u);
  EXPECT_NEAR(RankPeakRatio(report, 2), 1.0, 0.01);
}

// A first backward's parameter gradients stay: with few tokens per microbatch beside a wide
// hidden (64 tokens, hidden 256), the gradients made so far outweigh the activations freed, and
// the backward peaks with the MLP's and the attention's weights' gradients all made (counting
// only the activation gradients put B at half of measured). A later backward adds each fresh
// gradient into the .grad in place and peaks near W2's beside one ffn-sized gradient. llama in
// float32, GPipe, two microbatches (the second's backward accumulates).
TEST(Memory, AFirstBackwardsGradientsStandBesideItsTransients) {
  const auto report = Launch("grads_stand,llama,float32,2,gpipe,uniform,0,2,256,2,4,2,32,,32");
  EXPECT_EQ(ExpectActionPeaksNear(report, "", {{"B", 0.04}}), 2 * 2 * 2);  // 2 stages, 2 microbatches, 2 steps
}

}  // namespace
}  // namespace pipecheck

namespace pipecheck {
namespace {

// The model sizes a step from its sequence lengths alone; what it says the batch and this
// replica's microbatches hold is what making them holds (views counted once), shape by shape.
TEST(MemorySizing, StepShapesFromLengthsHoldWhatTheBatchHolds) {
  struct Case {
    const char* row;
    int replica;
  };
  const std::vector<Case> cases = {
      {"fixed,8,4,16,16,1", 0},       // every microbatch keeps every position: views
      {"varying,8,4,32,3,1", 0},      // trimmed microbatches: copies
      {"single,4,4,32,3,1", 0},       // one sequence each: views whatever their length
      {"uneven,11,3,24,2,1", 0},      // sizes 4, 4, 3
      {"replicas,12,3,32,3,2", 0},    // replica 0's 3 of 6 microbatches
      {"replicas,12,3,32,3,2", 1},    // replica 1's
  };
  for (const auto& c : cases) {
    const auto suite = harness::ParseSuite(
        fmt::format("name,batch,microbatches,seq_len,seq_len_min,data_parallel,steps\n{},3\n", c.row), "sizing.csv");
    auto config = harness::ToPipelineConfig(suite.at(0));
    config.replica = c.replica;
    for (int64_t step = 0; step < config.train.steps; ++step) {
      const auto batch = reference::MakeBatch(config.train.data, config.train.seed, step);
      const auto parts = pipeline::ReplicaMicrobatches(config, batch);
      std::set<const void*> seen;
      int64_t bytes = 0;
      auto add = [&](const torch::Tensor& tensor) {
        if (seen.insert(tensor.storage().data()).second) bytes += static_cast<int64_t>(tensor.storage().nbytes());
      };
      add(batch.tokens), add(batch.labels), add(batch.lengths);
      for (const auto& part : parts) add(part.tokens), add(part.labels), add(part.lengths);
      const auto shapes = pipeline::StepShapesOf(config, step);
      EXPECT_EQ(shapes.batch_bytes, bytes) << c.row << " replica " << c.replica << " step " << step;
      ASSERT_EQ(shapes.microbatches.size(), parts.size()) << c.row;
      for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_EQ(shapes.microbatches[i].sequences, parts[i].size()) << c.row << " microbatch " << i;
        EXPECT_EQ(shapes.microbatches[i].time, parts[i].time()) << c.row << " microbatch " << i;
      }
    }
  }
}

// Sizes the loader allows but no machine holds are refused from the floor, in floating point,
// without making the batch (65536 x 65536 tokens: 32 GiB) or walking a million actions.
TEST(MemorySizing, AbsurdSizesAreRefusedFromAFloorWithoutMakingAnything) {
  const auto suite = harness::ParseSuite(
      "name,batch,seq_len,microbatches,world_size,layers,heads,hidden,vocab\n"
      "tokens,65536,65536,1,1,4,4,64,256\n"
      "heads,65536,65536,65536,256,1024,1024,65536,1048576\n"
      "ranks,65536,4096,1024,256,256,4,64,256\n",
      "absurd.csv");
  for (const auto& scenario : suite) {
    const std::string problem = harness::MemoryProblem(scenario);
    EXPECT_NE(problem.find("needs at least"), std::string::npos) << scenario.name << ": " << problem;
    EXPECT_NE(problem.find("a floor from the memory model's terms"), std::string::npos) << scenario.name << ": " << problem;
    for (const auto& need : harness::MemoryNeeds(scenario)) {
      EXPECT_TRUE(std::isfinite(need.needed) && need.needed > 0) << scenario.name << " " << need.where;
    }
  }
  // The refusal points at the column behind most of it, as the loader's errors do: attention's
  // scores, which grow with the square of seq_len.
  EXPECT_EQ(harness::MemoryRefusalOf(suite.at(0)).place, "absurd.csv:2:3: column 'seq_len', value '65536'");
  // Every process is counted: 256 ranks' overhead alone is 64 GB.
  const auto host = harness::MemoryNeeds(suite.at(2)).at(0);
  EXPECT_EQ(host.where, "host memory");
  EXPECT_NE(host.detail.find("256 processes 64.0 GB (250.0 MB each)"), std::string::npos) << host.detail;
}

}  // namespace
}  // namespace pipecheck
