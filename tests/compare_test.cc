// `compare`: the clean case, each kind of regression, the warning, new scenarios, and bad
// input, on summaries written by the real report writer.
#include <gtest/gtest.h>

#include "reports/compare.h"
#include "reports/csv.h"
#include "reports/report.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

reports::ScenarioReport Row(const std::string& name, const std::string& status, const std::string& expect,
                            double tokens_per_s, double peak_bytes, double grad_rel_err) {
  reports::ScenarioReport report;
  report.summary = {{"scenario", name},
                    {"status", status},
                    {"expect", expect},
                    {"ok", (expect == "pass") == (status == "PASS") ? "1" : "0"},
                    {"pp_tokens_per_s", reports::FormatNumber(tokens_per_s)},
                    {"pp_peak_bytes_max", reports::FormatNumber(peak_bytes)},
                    {"grad_max_rel_err", reports::FormatNumber(grad_rel_err)},
                    {"message", "a, \"quoted\" message"}};
  return report;
}

class Compare : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = testing::ScratchDirectory("compare");
    baseline_ = {Row("a", "PASS", "pass", 1000, 5e6, 1e-15), Row("b", "PASS", "pass", 2000, 8e6, 2e-15),
                 Row("fault", "FAIL", "fail", 900, 4e6, 0.5)};
    reports::WriteReports(directory_ + "/baseline", baseline_);
  }

  reports::Comparison Against(const std::vector<reports::ScenarioReport>& current) {
    reports::WriteReports(directory_ + "/current", current);
    return reports::CompareSummaries(directory_ + "/baseline", directory_ + "/current/summary.csv", {});
  }

  const reports::ComparisonRow& RowOf(const reports::Comparison& comparison, const std::string& name) {
    for (const auto& row : comparison.rows) {
      if (row.scenario == name) return row;
    }
    throw std::runtime_error("no row " + name);
  }

  std::string directory_;
  std::vector<reports::ScenarioReport> baseline_;
};

TEST_F(Compare, IdenticalRunHasNoRegression) {
  const auto comparison = Against(baseline_);
  EXPECT_EQ(comparison.regressions, 0);
  EXPECT_EQ(comparison.warnings, 0);
  for (const auto& row : comparison.rows) EXPECT_EQ(row.verdict, "ok") << row.scenario << ": " << row.notes;
}

TEST_F(Compare, HalvedThroughputIsARegressionButFivePercentIsNot) {
  auto current = baseline_;
  current[0] = Row("a", "PASS", "pass", 500, 5e6, 1e-15);
  current[1] = Row("b", "PASS", "pass", 1900, 8e6, 2e-15);
  const auto comparison = Against(current);
  EXPECT_EQ(comparison.regressions, 1);
  EXPECT_EQ(RowOf(comparison, "a").verdict, "REGRESSION");
  EXPECT_EQ(RowOf(comparison, "a").notes, "tokens/s -50.0% (limit -10.0%)");
  EXPECT_EQ(RowOf(comparison, "b").verdict, "ok");
  EXPECT_EQ(RowOf(comparison, "b").throughput_change, "-5.0%");
}

TEST_F(Compare, MemoryGrowthPastTheLimitIsARegression) {
  auto current = baseline_;
  current[1] = Row("b", "PASS", "pass", 2000, 9.6e6, 2e-15);
  const auto comparison = Against(current);
  EXPECT_EQ(RowOf(comparison, "b").verdict, "REGRESSION");
  EXPECT_EQ(RowOf(comparison, "b").notes, "peak memory +20.0% (limit +10%)");
}

TEST_F(Compare, WorseStatusAndUncaughtFaultAreRegressions) {
  auto current = baseline_;
  current[0] = Row("a", "FAIL", "pass", 1000, 5e6, 1e-3);
  current[2] = Row("fault", "PASS", "fail", 900, 4e6, 1e-15);
  const auto comparison = Against(current);
  EXPECT_EQ(comparison.regressions, 2);
  EXPECT_EQ(RowOf(comparison, "a").notes, "no longer meets expect=pass: PASS -> FAIL");
  EXPECT_EQ(RowOf(comparison, "fault").notes, "no longer meets expect=fail: FAIL -> PASS");
}

TEST_F(Compare, MissingScenarioIsARegressionAndANewOneIsNot) {
  auto current = std::vector<reports::ScenarioReport>{baseline_[0], baseline_[2], Row("c", "PASS", "pass", 10, 1, 0)};
  const auto comparison = Against(current);
  EXPECT_EQ(comparison.regressions, 1);
  EXPECT_EQ(RowOf(comparison, "b").notes, "missing from the current run");
  EXPECT_EQ(RowOf(comparison, "c").verdict, "new");
}

TEST_F(Compare, ParityErrorGrowingTenfoldWhilePassingIsAWarning) {
  auto current = baseline_;
  current[0] = Row("a", "PASS", "pass", 1000, 5e6, 2e-14);
  const auto comparison = Against(current);
  EXPECT_EQ(comparison.regressions, 0);
  EXPECT_EQ(comparison.warnings, 1);
  EXPECT_EQ(RowOf(comparison, "a").verdict, "warning");
  EXPECT_NE(RowOf(comparison, "a").notes.find("gradient error grew 20x"), std::string::npos);
}

TEST_F(Compare, BadInputNamesTheFileAndProblem) {
  try {
    reports::CompareSummaries(directory_ + "/nowhere", directory_ + "/baseline", {});
    FAIL();
  } catch (const reports::CompareError& error) {
    EXPECT_NE(std::string(error.what()).find("nowhere: cannot open"), std::string::npos) << error.what();
  }
  reports::WriteFileAtomically(directory_ + "/bad.csv", "scenario,status\na,PASS\n");
  try {
    reports::CompareSummaries(directory_ + "/bad.csv", directory_ + "/baseline", {});
    FAIL();
  } catch (const reports::CompareError& error) {
    EXPECT_NE(std::string(error.what()).find("bad.csv: not a pipecheck summary: column 'expect' is missing"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace pipecheck
