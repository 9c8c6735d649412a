// `pipecheck invariance`: the model of which variants do the same arithmetic, the tensors each
// run leaves, the pair comparison down to one unit in the last place, and real runs of the CLI:
// a correct trainer is bitwise equal wherever the model says so, and a trainer that sums one
// rank's microbatch gradients in another order passes parity but not the matrix.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/wait.h>

#include "harness/invariance.h"
#include "harness/scenario_model.h"
#include "reports/csv.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kSuite = PIPECHECK_SOURCE_DIR "/tests/data/invariance.csv";

scenarios::Scenario Base(const std::string& name) {
  const auto suite = harness::LoadSuite(kSuite);
  return scenarios::FindScenario(suite, name, kSuite);  // a copy: the suite goes out of scope
}

scenarios::Scenario With(scenarios::Scenario s, int64_t ws, const std::string& schedule, int64_t v,
                         const std::string& partition = "uniform", int64_t microbatches = 4) {
  s.world_size = ws;
  s.schedule = schedule;
  s.virtual_stages = v;
  s.partition = partition;
  s.microbatches = microbatches;
  return s;
}

std::string Difference(const scenarios::Scenario& a, const scenarios::Scenario& b) {
  return harness::ArithmeticDifference(harness::ArithmeticOf(a), harness::ArithmeticOf(b));
}

TEST(ArithmeticKey, WorldSizeScheduleAndPartitionKeepTheArithmetic) {
  const auto base = Base("tied_varlen");
  for (const auto& other : {With(base, 3, "1f1b", 1), With(base, 4, "1f1b", 1), With(base, 2, "gpipe", 1),
                            With(base, 2, "zbh1", 1), With(base, 2, "zbv", 2), With(base, 2, "interleaved", 2),
                            With(base, 2, "1f1b", 1, "4;0"), With(base, 4, "gpipe", 1, "0;0;0;4")}) {
    EXPECT_EQ(Difference(base, other), "") << other.world_size << " " << other.schedule << " " << other.partition;
  }
}

TEST(ArithmeticKey, MicrobatchesTiedSumsAndClippingChangeIt) {
  const auto base = Base("tied_varlen");
  EXPECT_EQ(Difference(base, With(base, 2, "1f1b", 1, "uniform", 8)),
            "4 vs 8 microbatches: other rows in each matmul");
  // One stage holds both uses of the tied weight: summed inside each backward, not after.
  EXPECT_EQ(Difference(base, With(base, 1, "1f1b", 1)),
            "tied weight's two uses accumulated per copy, then summed vs summed inside one stage's backward");
  // With one microbatch that is one sum of two terms either way; ws1 m1 is the reference's arithmetic.
  const auto single = With(base, 1, "1f1b", 1, "uniform", 1);
  EXPECT_EQ(harness::ArithmeticDifference(harness::ReferenceArithmetic(base), harness::ArithmeticOf(single)), "");
  EXPECT_EQ(Difference(single, With(base, 2, "1f1b", 1, "uniform", 1)), "");

  const auto clipped = Base("clipped");
  EXPECT_EQ(Difference(clipped, With(clipped, 2, "gpipe", 1)), "");
  EXPECT_EQ(Difference(clipped, With(clipped, 3, "1f1b", 1)),
            "clipping norm summed in rank groups {embedding, layer 0, layer 1 | layer 2, layer 3, head} vs "
            "{embedding, layer 0, layer 1 | layer 2 | layer 3, head}");
  auto unclipped = clipped;
  unclipped.clip = 0.0;
  EXPECT_EQ(Difference(unclipped, With(unclipped, 3, "1f1b", 1)), "");
}

TEST(ArithmeticKey, ReplicasChangeTheSumAndRecomputationDoesNot) {
  const auto base = Base("tied_varlen");
  auto replicated = base;
  replicated.data_parallel = 2;
  replicated.microbatches = 2;  // the global batch still in 4 microbatches of the same rows
  EXPECT_EQ(Difference(base, replicated),
            "1 vs 2 replicas: each replica sums its own microbatches' gradients, then the replicas' sums are added");
  // Replicated pipelines of other shapes and schedules keep the same arithmetic among themselves.
  auto other = With(replicated, 4, "gpipe", 1, "uniform", 2);
  other.data_parallel = 2;
  EXPECT_EQ(Difference(replicated, other), "");
  auto recomputed = base;
  recomputed.recompute = true;
  EXPECT_EQ(Difference(base, recomputed), "");
}

TEST(ArithmeticKey, AnotherAccumulationOrderIsAnotherArithmetic) {
  const auto key = harness::ArithmeticOf(Base("tied_varlen"));
  ASSERT_EQ(key.accumulation.size(), 6u);  // embedding, four layers, head
  EXPECT_EQ(key.accumulation[2].first, "layer 1");
  EXPECT_EQ(key.accumulation[2].second, (std::vector<int>{0, 1, 2, 3}));
  auto swapped = key;
  std::swap(swapped.accumulation[2].second[0], swapped.accumulation[2].second[1]);
  EXPECT_EQ(harness::ArithmeticDifference(key, swapped),
            "layer 1's gradient accumulated over microbatches 0,1,2,3 vs 1,0,2,3");
  auto reordered = key;
  std::swap(reordered.loss_order[0], reordered.loss_order[3]);
  EXPECT_EQ(harness::ArithmeticDifference(key, reordered), "loss terms summed in microbatch order 0,1,2,3 vs 3,1,2,0");
}

TEST(InvarianceVariants, EachPipelineOnceTheBaseFirstAndWhyOthersCannotRun) {
  const auto base = Base("tied_varlen");
  harness::InvarianceOptions options;
  options.microbatches = {8, 16};  // 16 microbatches of a batch of 8 cannot be
  std::vector<harness::SkippedVariant> skipped;
  const auto variants = harness::InvarianceVariants(base, options, &skipped);
  ASSERT_GE(variants.size(), 10u);
  EXPECT_EQ(variants.front().axis, "base");
  EXPECT_EQ(variants.front().label, "ws2.1f1b.uniform");
  std::set<std::string> labels, names;
  std::set<std::string> axes;
  for (const auto& variant : variants) {
    EXPECT_TRUE(labels.insert(variant.label).second) << variant.label;
    EXPECT_TRUE(names.insert(variant.scenario.name).second) << variant.scenario.name;
    EXPECT_EQ(variant.scenario.name, "tied_varlen." + variant.label);
    axes.insert(variant.axis);
  }
  for (const char* label : {"ws1.1f1b.uniform", "ws4.1f1b.uniform", "ws2.1f1b.front", "ws2.1f1b.back",
                            "ws2.gpipe.uniform", "ws2.zbv.v2.uniform", "ws2.1f1b.uniform.m8", "ws2.1f1b.uniform.dp2",
                            "ws2.1f1b.uniform.rc"}) {
    EXPECT_TRUE(labels.count(label)) << label;
  }
  EXPECT_EQ(axes, (std::set<std::string>{"base", "world_size", "partition", "schedule", "microbatches",
                                         "data_parallel", "recompute"}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].label, "ws2.1f1b.uniform.m16");
  EXPECT_NE(skipped[0].reason.find("column 'microbatches'"), std::string::npos) << skipped[0].reason;

  // The whole suite of variants loads back as scenarios.
  const auto text = scenarios::ToCsv([&] {
    std::vector<scenarios::Scenario> all;
    for (const auto& variant : variants) all.push_back(variant.scenario);
    return all;
  }());
  EXPECT_EQ(harness::ParseSuite(text, "variants.csv").size(), variants.size());

  options.full = true;
  options.microbatches.clear();
  options.world_sizes = {1, 2};
  EXPECT_GT(harness::InvarianceVariants(base, options, nullptr).size(), variants.size());
}

harness::TrainedTensors SomeTensors() {
  harness::TrainedTensors t;
  t.losses = {1.5, 1.25};
  for (int step = 0; step < 2; ++step) {
    reference::NamedTensors gradients;
    gradients.insert("w", torch::linspace(-1, 1, 12, torch::kFloat64).reshape({3, 4}) * (step + 1));
    gradients.insert("b", torch::full({4}, 0.25 * step, torch::kFloat64));
    t.gradients.push_back(gradients);
  }
  t.final_weights.insert("w", torch::ones({3, 4}, torch::kFloat64));
  t.final_weights.insert("b", torch::zeros({4}, torch::kFloat64));
  return t;
}

TEST(TrainedTensors, RoundTripAndOneUnitInTheLastPlaceBreaksBitwise) {
  const auto original = SomeTensors();
  const auto path = testing::ScratchDirectory("invariance_tensors") + "/tensors.pt";
  harness::SaveTrainedTensors(original, path);
  const auto loaded = harness::LoadTrainedTensors(path);
  const auto same = harness::CompareTrained(loaded, original, 1e-5);
  EXPECT_TRUE(same.bitwise) << same.first_difference << same.problem;
  EXPECT_EQ(same.grad_max_abs_diff, 0.0);
  EXPECT_EQ(same.problem, "");
  EXPECT_EQ(std::vector<std::string>(loaded.gradients[1].keys()), (std::vector<std::string>{"w", "b"}));

  auto nudged = original;
  nudged.gradients[1]["w"] = original.gradients[1]["w"].clone();
  auto element = nudged.gradients[1]["w"][2][3];
  element.fill_(std::nextafter(element.item<double>(), 10.0));
  const auto ulp = harness::CompareTrained(nudged, original, 1e-5);
  EXPECT_FALSE(ulp.bitwise);
  EXPECT_EQ(ulp.first_difference, "step 1 w");
  EXPECT_GT(ulp.grad_max_abs_diff, 0.0);
  EXPECT_LT(ulp.grad_max_abs_diff, 1e-15);
  EXPECT_EQ(ulp.worst_param, "step 1 w");

  auto loss = original;
  loss.losses[0] = std::nextafter(loss.losses[0], 0.0);
  EXPECT_EQ(harness::CompareTrained(loss, original, 1e-5).first_difference, "step 0 loss");

  auto missing = original;
  missing.gradients[0] = reference::NamedTensors();
  missing.gradients[0].insert("w", original.gradients[0]["w"]);
  const auto incomplete = harness::CompareTrained(original, missing, 1e-5);
  EXPECT_FALSE(incomplete.bitwise);
  EXPECT_EQ(incomplete.problem, "step 0: b has no counterpart");
}

// The matrix from what runs left, no rank involved: two entries of one arithmetic with the same
// bits are "=", a third of that arithmetic one unit in the last place off is the broken pair ("!"),
// an entry of another arithmetic is compared but not asserted, and the classes group by arithmetic.
TEST(InvarianceMatrix, TheSameArithmeticMustGiveTheSameBitsAndOtherArithmeticIsOnlyReported) {
  harness::ArithmeticKey one;
  one.device = "cpu", one.dtype = "float64", one.microbatches = 4;
  harness::ArithmeticKey other = one;
  other.microbatches = 8;
  const auto tensors = SomeTensors();
  auto nudged = tensors;
  nudged.gradients[1]["w"] = tensors.gradients[1]["w"].clone();
  auto element = nudged.gradients[1]["w"][0][0];
  element.fill_(std::nextafter(element.item<double>(), 10.0));
  const std::vector<harness::MatrixEntry> entries = {
      {"a", one, tensors}, {"b", one, tensors}, {"c", one, nudged}, {"d", other, nudged}};

  const auto matrix = harness::BuildMatrix(entries, 1e-5, /*assert_bitwise=*/true);
  ASSERT_EQ(matrix.pairs.size(), 6u);
  EXPECT_EQ(matrix.asserted, 3);  // a-b, a-c, b-c
  EXPECT_EQ(matrix.bitwise, 2);   // a-b, c-d
  EXPECT_EQ(matrix.broken, 2);    // a-c, b-c
  const auto& ab = matrix.pairs[0];
  EXPECT_TRUE(ab.asserted && ab.ok && ab.comparison.bitwise);
  const auto& ac = matrix.pairs[1];
  EXPECT_FALSE(ac.ok);
  EXPECT_EQ(ac.comparison.first_difference, "step 1 w");
  const auto& ad = matrix.pairs[2];
  EXPECT_FALSE(ad.asserted);
  EXPECT_TRUE(ad.ok);
  EXPECT_EQ(ad.difference, "4 vs 8 microbatches: other rows in each matmul");
  EXPECT_EQ(matrix.classes, (std::vector<std::vector<size_t>>{{0, 1, 2}, {3}}));

  // Reported, not asserted (not float64 on the CPU): nothing is broken.
  EXPECT_EQ(harness::BuildMatrix(entries, 1e-5, /*assert_bitwise=*/false).broken, 0);

  const auto csv = reports::ParseCsv(harness::InvarianceCsv("s", matrix), "invariance.csv");
  ASSERT_EQ(csv.size(), 7u);
  EXPECT_EQ(csv[0], harness::InvarianceColumns());
  EXPECT_EQ(csv[2][1] + "/" + csv[2][2] + " ok=" + csv[2][12], "a/c ok=0");
  std::ostringstream printed;
  harness::PrintMatrix(printed, matrix);
  EXPECT_NE(printed.str().find("NOT BITWISE: a vs c: the same arithmetic, but not bitwise equal: first at step 1 w"),
            std::string::npos)
      << printed.str();
  EXPECT_NE(printed.str().find("[0] a, [1] b, [2] c"), std::string::npos) << printed.str();
}

// Runs the CLI; returns its exit code and leaves its output in `output`.
int RunCli(const std::string& arguments, std::string& output) {
  FILE* pipe = popen((std::string(PIPECHECK_BINARY) + " " + arguments + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, read);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A CSV file's rows as column -> value maps, read with the reports' own parser.
std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  const auto records = reports::ParseCsv(text.str(), path);
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t r = 1; r < records.size(); ++r) {
    std::map<std::string, std::string> row;
    for (size_t c = 0; c < records[0].size() && c < records[r].size(); ++c) row[records[0][c]] = records[r][c];
    rows.push_back(row);
  }
  return rows;
}

TEST(Invariance, RealRanksAreBitwiseEqualWhereTheArithmeticIsTheSame) {
  const auto out = testing::ScratchDirectory("invariance_tied_varlen");
  std::string output;
  const int code = RunCli(fmt::format("invariance --scenarios {} --scenario tied_varlen --out {} --world-sizes 1,2,4 "
                                      "--microbatches 1,8",
                                      kSuite, out),
                          output);
  ASSERT_EQ(code, 0) << output;
  for (const auto& row : ReadCsv(out + "/summary.csv")) EXPECT_EQ(row.at("status"), "PASS") << row.at("scenario");
  const auto pairs = ReadCsv(out + "/invariance.csv");
  int asserted = 0, differing = 0;
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::string>> by_pair;
  for (const auto& row : pairs) {
    by_pair[{row.at("a"), row.at("b")}] = row;
    if (row.at("asserted") == "1") {
      ++asserted;
      EXPECT_EQ(row.at("bitwise"), "1") << row.at("a") << " vs " << row.at("b") << ": " << row.at("first_bits_differ");
      EXPECT_EQ(row.at("loss_max_abs_diff"), "0");
    }
    if (row.at("same_arithmetic") == "0" && row.at("bitwise") == "0") ++differing;
  }
  // Ten variants share the pipelines' arithmetic (45 pairs: dualpipev and the recomputing
  // variant among them); ws2 m1 shares the reference's (1).
  EXPECT_EQ(asserted, 46) << output;
  // Recomputation does the same arithmetic, to the bit; two replicas sum in another order.
  const auto& recomputed = by_pair.at({"ws2.1f1b.uniform", "ws2.1f1b.uniform.rc"});
  EXPECT_EQ(recomputed.at("asserted"), "1");
  EXPECT_EQ(recomputed.at("bitwise"), "1");
  const auto& replicated = by_pair.at({"ws2.1f1b.uniform", "ws2.1f1b.uniform.dp2"});
  EXPECT_EQ(replicated.at("same_arithmetic"), "0");
  EXPECT_LT(std::stod(replicated.at("grad_max_rel_err")), 1e-13);
  EXPECT_GE(differing, 10) << output;  // the comparison sees rounding where the arithmetic differs
  // One microbatch on two ranks does the reference's own arithmetic, to the bit.
  const auto& single = by_pair.at({"reference", "ws2.1f1b.uniform.m1"});
  EXPECT_EQ(single.at("asserted"), "1");
  EXPECT_EQ(single.at("bitwise"), "1");
  // Eight microbatches and the tied sum inside one stage are other arithmetic, and not bitwise.
  const auto& eight = by_pair.at({"ws2.1f1b.uniform", "ws2.1f1b.uniform.m8"});
  EXPECT_EQ(eight.at("same_arithmetic"), "0");
  EXPECT_EQ(eight.at("bitwise"), "0");
  EXPECT_LT(std::stod(eight.at("grad_max_rel_err")), 1e-13);
  EXPECT_EQ(by_pair.at({"ws2.1f1b.uniform", "ws1.1f1b.uniform"}).at("same_arithmetic"), "0");
  EXPECT_EQ(by_pair.at({"ws2.1f1b.uniform", "ws4.1f1b.uniform"}).at("asserted"), "1");
  EXPECT_EQ(harness::LoadSuite(out + "/variants.csv").size(), ReadCsv(out + "/summary.csv").size());
  EXPECT_NE(output.find("0 of those not bitwise"), std::string::npos) << output;
}

TEST(Invariance, MixtureOfExpertsRoutesToTheSameBitsInEveryPipelineOfOneArithmetic) {
  const auto out = testing::ScratchDirectory("invariance_moe");
  std::string output;
  const int code = RunCli(fmt::format("invariance --scenarios {} --scenario moe_varlen --out {}", kSuite, out), output);
  ASSERT_EQ(code, 0) << output;
  for (const auto& row : ReadCsv(out + "/summary.csv")) EXPECT_EQ(row.at("status"), "PASS") << row.at("scenario");
  int asserted = 0;
  for (const auto& row : ReadCsv(out + "/invariance.csv")) {
    if (row.at("asserted") != "1") continue;
    ++asserted;
    EXPECT_EQ(row.at("bitwise"), "1") << row.at("a") << " vs " << row.at("b") << ": " << row.at("first_bits_differ");
  }
  // 1F1B on 1 to 4 ranks, front- and back-loaded, GPipe, interleaved, ZB-H1, ZB-V, DualPipeV and
  // 1F1B recomputing: one class of arithmetic, C(12, 2) = 66 pairs, each asserted bitwise.
  EXPECT_EQ(asserted, 66) << output;
}

TEST(Invariance, SummingOneRanksMicrobatchesInAnotherOrderPassesParityButNotTheMatrix) {
  const auto out = testing::ScratchDirectory("invariance_reversed");
  std::string output;
  const int code = RunCli(
      fmt::format("invariance --scenarios {} --scenario reversed_on_rank0 --out {} --world-sizes 1,2", kSuite, out),
      output);
  EXPECT_EQ(code, 1) << output;
  for (const auto& row : ReadCsv(out + "/summary.csv")) EXPECT_EQ(row.at("status"), "PASS") << row.at("scenario");
  int broken = 0;
  for (const auto& row : ReadCsv(out + "/invariance.csv")) {
    if (row.at("asserted") == "1" && row.at("bitwise") == "0") {
      ++broken;
      EXPECT_EQ(row.at("ok"), "0");
      EXPECT_LT(std::stod(row.at("grad_max_rel_err")), 1e-13);  // rounding only: parity cannot see it
    }
  }
  EXPECT_GE(broken, 1) << output;
  EXPECT_NE(output.find("NOT BITWISE: "), std::string::npos) << output;
}

TEST(Invariance, BadInputIsExitTwo) {
  std::string output;
  EXPECT_EQ(RunCli(fmt::format("invariance --scenarios {} --scenario no_such", kSuite), output), 2) << output;
  EXPECT_NE(output.find("no_such"), std::string::npos) << output;
  output.clear();
  EXPECT_EQ(RunCli(fmt::format("invariance --scenarios {} --scenario tied_varlen --world-sizes 0", kSuite), output), 2)
      << output;
}

}  // namespace
}  // namespace pipecheck
