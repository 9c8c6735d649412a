// `compare` and baselines: the clean case, each kind of regression, the warning, new scenarios,
// changed configurations, noise-aware limits and bad input, on summaries written by the real
// report writer. (JUnit and Markdown: ci_reports_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "reports/compare.h"
#include "reports/csv.h"
#include "reports/junit.h"
#include "reports/markdown.h"
#include "reports/report.h"
#include "scenarios/scenario.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

using testing::SummaryRow;
constexpr auto Row = &SummaryRow;

// A PASS row of scenario "s" at 1000 tokens/s whose tokens/s spread `spread` over `runs` runs.
reports::ScenarioReport RowWithSpread(double spread, int64_t runs) {
  auto row = Row("s", "PASS", "pass", 1000, 5e6, 1e-15);
  row.summary.pp_tokens_per_s_spread = spread;
  row.summary.pp_tokens_per_s_runs = runs;
  return row;
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

// A run of some rows (run --only, compare --only) is compared on those rows: the baseline's
// others are left out and counted, not missing; a glob that selects nothing is bad input.
TEST_F(Compare, OnlyComparesTheSelectedRowsAndCountsTheOthersLeftOut) {
  reports::WriteReports(directory_ + "/current", {baseline_[0]});
  reports::CompareOptions options;
  options.only = "a,fau*";
  const auto comparison = reports::CompareSummaries(directory_ + "/baseline", directory_ + "/current", options);
  EXPECT_EQ(comparison.regressions, 1);  // "fault" is selected and did not run: still missing
  EXPECT_EQ(RowOf(comparison, "fault").notes, "missing from the current run");
  EXPECT_EQ(comparison.left_out, 1);     // "b"
  EXPECT_EQ(comparison.rows.size(), 2u);
  EXPECT_NE(reports::FormatComparison(comparison, options)
                .find("1 baseline scenario(s) left out: not selected by --only 'a,fau*'"),
            std::string::npos);
  options.only = "a";
  const auto only_a = reports::CompareSummaries(directory_ + "/baseline", directory_ + "/current", options);
  EXPECT_EQ(only_a.regressions, 0);
  EXPECT_EQ(only_a.left_out, 2);
  // Without --only, the same subset fails: every row not run is missing.
  EXPECT_EQ(reports::CompareSummaries(directory_ + "/baseline", directory_ + "/current", {}).regressions, 2);
  options.only = "a,typo*";
  try {
    reports::CompareSummaries(directory_ + "/baseline", directory_ + "/current", options);
    FAIL() << "a glob that selects nothing was accepted";
  } catch (const reports::CompareError& error) {
    EXPECT_NE(std::string(error.what()).find("--only 'typo*': no scenario of"), std::string::npos) << error.what();
  }
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

namespace pipecheck {
namespace {

// The same scenario name under another configuration is its own kind of change, never "ok": the
// row says which columns changed and the comparison fails. A baseline without fingerprints still
// compares, with a note that it cannot see such changes.
TEST(CompareConfiguration, AChangedConfigurationIsNeverOk) {
  const auto directory = testing::ScratchDirectory("compare_config");
  auto row = [](const std::string& configuration) {
    auto report = Row("s", "PASS", "pass", 1000, 5e6, 1e-15);
    report.summary.config = configuration;
    report.summary.fingerprint = scenarios::Fingerprint(configuration);
    return report;
  };
  reports::WriteReports(directory + "/baseline", {row("layers=4 world_size=2 schedule=1f1b dtype=float64")});
  reports::WriteReports(directory + "/same", {row("layers=4 world_size=2 schedule=1f1b dtype=float64")});
  reports::WriteReports(directory + "/changed", {row("layers=4 world_size=4 schedule=gpipe dtype=float64")});
  const auto same = reports::CompareSummaries(directory + "/baseline", directory + "/same", {});
  EXPECT_EQ(same.rows[0].verdict, "ok");
  EXPECT_EQ(same.regressions, 0);
  const auto changed = reports::CompareSummaries(directory + "/baseline", directory + "/changed", {});
  EXPECT_EQ(changed.rows[0].verdict, "CHANGED");
  EXPECT_EQ(changed.regressions, 1);
  EXPECT_EQ(changed.changed, 1);
  EXPECT_TRUE(reports::Fails(changed.rows[0]));
  EXPECT_EQ(changed.rows[0].notes, "configuration changed (world_size 2 -> 4, schedule 1f1b -> gpipe): not comparable; "
                                   "re-record the baseline or restore the scenario");
  reports::WriteReports(directory + "/old", {Row("s", "PASS", "pass", 1000, 5e6, 1e-15)});
  const auto old = reports::CompareSummaries(directory + "/old", directory + "/changed", {});
  EXPECT_EQ(old.rows[0].verdict, "ok");
  EXPECT_EQ(old.unfingerprinted, 1);
  EXPECT_NE(reports::FormatComparison(old, {}).find("records no configuration for 1 scenario(s)"), std::string::npos);
}

// A PASS row measured its speed and memory: a baseline whose PASS row has nan or nothing there
// would leave the scenario ungated, so it is bad input naming the file, line and column.
TEST(CompareBadInput, APassBaselineRowWithoutItsMeasurementIsRefused) {
  const auto directory = testing::ScratchDirectory("compare_nan");
  for (const std::string value : {"nan", ""}) {
    auto base = Row("s", "PASS", "pass", 1000, 5e6, 1e-15);
    base.summary.pp_tokens_per_s = value.empty() ? std::nullopt : std::optional<double>(std::nan(""));
    reports::WriteReports(directory + "/baseline", {base});
    reports::WriteReports(directory + "/current", {Row("s", "PASS", "pass", 1000, 5e6, 1e-15)});
    try {
      reports::CompareSummaries(directory + "/baseline", directory + "/current", {});
      ADD_FAILURE() << "accepted pp_tokens_per_s '" << value << "' in a PASS baseline row";
    } catch (const reports::CompareError& error) {
      EXPECT_NE(std::string(error.what()).find("summary.csv:2: column 'pp_tokens_per_s', value '" + value +
                                               "': a PASS row must hold its measured number"),
                std::string::npos) << error.what();
    }
  }
}

// The same holds for the current run: a PASS row without its tokens/s or peak would pass ungated.
TEST(CompareBadInput, APassCurrentRowWithoutItsMeasurementIsRefused) {
  const auto directory = testing::ScratchDirectory("compare_nan_current");
  for (const std::string column : {"pp_tokens_per_s", "pp_peak_bytes_max"}) {
    auto now = Row("s", "PASS", "pass", 1000, 5e6, 1e-15);
    if (column == "pp_tokens_per_s") now.summary.pp_tokens_per_s = std::nullopt;
    if (column == "pp_peak_bytes_max") now.summary.pp_peak_bytes_max = std::nullopt;
    reports::WriteReports(directory + "/baseline", {Row("s", "PASS", "pass", 1000, 5e6, 1e-15)});
    reports::WriteReports(directory + "/current", {now});
    try {
      reports::CompareSummaries(directory + "/baseline", directory + "/current", {});
      ADD_FAILURE() << "accepted an empty " << column << " in a PASS current row";
    } catch (const reports::CompareError& error) {
      EXPECT_NE(std::string(error.what()).find("current/summary.csv:2: column '" + column +
                                               "', value '': a PASS row must hold its measured number"),
                std::string::npos) << error.what();
    }
  }
}

// A baseline that recorded no spread (one run of too few timed steps) knows nothing of the
// runner's noise: its tokens/s is not gated, and a drop past the limit is a warning saying why.
TEST(NoiseAwareBaseline, WithoutASpreadThroughputIsNotGated) {
  const auto directory = testing::ScratchDirectory("no_spread");
  auto one_run = Row("s", "PASS", "pass", 1000, 5e6, 1e-15);
  one_run.summary.pp_tokens_per_s_spread = std::nullopt;
  one_run.summary.pp_tokens_per_s_runs = 1;
  reports::WriteReports(directory + "/baseline", {one_run});
  EXPECT_EQ(reports::ScenariosWithoutSpread(directory + "/baseline"), std::vector<std::string>{"s"});
  reports::WriteReports(directory + "/current", {Row("s", "PASS", "pass", 850, 5e6, 1e-15)});
  const auto comparison = reports::CompareSummaries(directory + "/baseline", directory + "/current", {});
  EXPECT_EQ(comparison.regressions, 0);
  EXPECT_EQ(comparison.rows[0].verdict, "warning");
  EXPECT_EQ(comparison.rows[0].throughput_limit, "not gated");
  EXPECT_EQ(comparison.rows[0].notes.rfind("tokens/s -15.0%, not gated: the baseline recorded no spread", 0), 0u)
      << comparison.rows[0].notes;
  // Memory is still gated.
  reports::WriteReports(directory + "/bigger", {Row("s", "PASS", "pass", 1000, 6e6, 1e-15)});
  EXPECT_EQ(reports::CompareSummaries(directory + "/baseline", directory + "/bigger", {}).rows[0].verdict, "REGRESSION");
}

// A row the run timed once (the default suite's generated rows, or --timed-steps 0) has one
// sample of the runner's noise for its tokens/s: not gated, whatever spread the baseline has;
// timed over several steps the same drop is a regression.
TEST(NoiseAwareBaseline, ARowTimedOnceIsNotGated) {
  const auto directory = testing::ScratchDirectory("timed_once");
  reports::WriteReports(directory + "/baseline", {RowWithSpread(0.05, 3)});
  auto compare = [&](int64_t timed) {
    auto now = Row("s", "PASS", "pass", 500, 5e6, 1e-15);
    now.summary.pp_timed_steps = timed;
    reports::WriteReports(directory + "/current", {now});
    return reports::CompareSummaries(directory + "/baseline", directory + "/current", {});
  };
  const auto once = compare(1);
  EXPECT_EQ(once.regressions, 0);
  EXPECT_EQ(once.rows[0].throughput_limit, "not gated");
  EXPECT_EQ(once.rows[0].verdict, "ok");
  EXPECT_EQ(once.rows[0].notes, "");
  EXPECT_EQ(compare(5).regressions, 1);
}

// Names longer than the small-string buffer live on the heap: the list of scenarios that did not
// meet their expectation, and the refusal that quotes it, must name them intact (they were read
// from freed memory once, and printed garbage; the sanitizer build catches any relapse).
TEST(BaselineGate, NamesEveryScenarioThatDidNotMeetItsExpectation) {
  const auto directory = testing::ScratchDirectory("baseline_gate");
  reports::WriteReports(directory + "/run", {Row("a_scenario_name_longer_than_sixteen", "FAIL", "pass", 1000, 5e6, 0.5),
                                             Row("fine", "PASS", "pass", 1000, 5e6, 1e-15),
                                             Row("another_long_scenario_name_here", "ERROR", "pass", 0, 0, 0)});
  EXPECT_EQ(reports::ScenariosNotOk(directory + "/run"),
            (std::vector<std::string>{"a_scenario_name_longer_than_sixteen", "another_long_scenario_name_here"}));
  try {
    reports::PromoteToBaseline({directory + "/run"}, directory + "/baseline", false);
    ADD_FAILURE() << "a failing run was promoted";
  } catch (const reports::CompareError& error) {
    EXPECT_NE(std::string(error.what()).find("2 scenario(s) did not meet their expectation "
                                             "(a_scenario_name_longer_than_sixteen, another_long_scenario_name_here)"),
              std::string::npos) << error.what();
  }
}

// Three runs of a noisy runner merged into one baseline: the fastest run's row, and a spread that
// one slow run does not widen (1.4826 x the median absolute deviation of the runs' tokens/s, or
// the runs' own median spread, whichever is larger).
TEST(NoiseAwareBaseline, ThreeRunsMergeIntoTheFastestAndARobustSpread) {
  const auto directory = testing::ScratchDirectory("noise_aware");
  const std::vector<double> rates = {1000, 880, 920};  // deviations from 920: 80, 40, 0
  const std::vector<double> outlier = {1000, 990, 500};  // one run on a busy moment
  std::vector<std::string> runs;
  for (size_t i = 0; i < rates.size(); ++i) {
    runs.push_back(directory + "/run" + std::to_string(i));
    reports::WriteReports(runs.back(), {Row("noisy", "PASS", "pass", rates[i], 5e6, 1e-15),
                                        Row("quiet", "PASS", "pass", 2000 + i, 8e6, 1e-15),
                                        Row("outlier", "PASS", "pass", outlier[i], 8e6, 1e-15)});
  }
  reports::PromoteToBaseline(runs, directory + "/baseline", false);
  std::ifstream stream(directory + "/baseline/summary.csv");
  std::stringstream text;
  text << stream.rdbuf();
  const auto records = reports::ParseCsv(text.str(), "summary.csv");
  ASSERT_EQ(records.size(), 4u);
  const auto column = [&](const std::string& name) {
    return static_cast<size_t>(std::find(records[0].begin(), records[0].end(), name) - records[0].begin());
  };
  EXPECT_EQ(records[1][column("scenario")], "noisy");
  EXPECT_EQ(records[1][column("pp_tokens_per_s")], "1000");
  EXPECT_EQ(records[1][column("pp_tokens_per_s_runs")], "3");
  EXPECT_NEAR(std::stod(records[1][column("pp_tokens_per_s_spread")]), 1.4826 * 40.0 / 920.0, 1e-12);
  // Runs 1 apart: their own 1% spread is the larger.
  EXPECT_NEAR(std::stod(records[2][column("pp_tokens_per_s_spread")]), 0.01, 1e-12);
  // The slow run moves neither the fastest nor the spread: (max - min) / median would be 50.5%.
  EXPECT_EQ(records[3][column("pp_tokens_per_s")], "1000");
  EXPECT_NEAR(std::stod(records[3][column("pp_tokens_per_s_spread")]), 1.4826 * 10.0 / 990.0, 1e-12);

  // The noisy scenario may lose 3 x 6.4% = 19.3%; the quiet one only the 10% floor.
  auto compare = [&](double noisy, double quiet) {
    reports::WriteReports(directory + "/current", {Row("noisy", "PASS", "pass", noisy, 5e6, 1e-15),
                                                   Row("quiet", "PASS", "pass", quiet, 8e6, 1e-15),
                                                   Row("outlier", "PASS", "pass", 990, 8e6, 1e-15)});
    return reports::CompareSummaries(directory + "/baseline", directory + "/current", {});
  };
  const auto noise = compare(1000 * 0.85, 2002 * 0.95);  // noisy -15%: within its noise; quiet -5%
  EXPECT_EQ(noise.regressions, 0) << noise.rows[0].notes << noise.rows[1].notes;
  EXPECT_EQ(noise.rows[0].throughput_limit, "-19.3%");
  EXPECT_EQ(noise.rows[1].throughput_limit, "-10.0%");
  const auto slower = compare(1000 * 0.75, 2002 * 0.80);  // noisy -25%, quiet -20%: both beyond
  EXPECT_EQ(slower.regressions, 2);
  EXPECT_EQ(slower.rows[0].notes, "tokens/s -25.0% (limit -19.3%: 3 x the baseline's 6.4% spread over 3 runs)");
  EXPECT_EQ(slower.rows[1].notes, "tokens/s -20.0% (limit -10.0%)");
  EXPECT_TRUE(slower.rows[0].slower_only);

  // Runs of different suites cannot be merged.
  reports::WriteReports(directory + "/other", {Row("noisy", "PASS", "pass", 900, 5e6, 1e-15)});
  EXPECT_THROW(reports::PromoteToBaseline({runs[0], directory + "/other"}, directory + "/bad", false),
               reports::CompareError);
}

// However noisy the baseline, its noise widens the limit to the cap and no further: a 50% drop
// is a regression on every gated row (uncapped, 3 x 40% would allow -120%, below -100%).
TEST(NoiseAwareBaseline, TheNoiseLimitIsCapped) {
  const auto directory = testing::ScratchDirectory("noise_cap");
  auto noisy = RowWithSpread(0.40, 1);
  reports::WriteReports(directory + "/baseline", {noisy});
  auto compare = [&](double rate) {
    reports::WriteReports(directory + "/current", {Row("s", "PASS", "pass", rate, 5e6, 1e-15)});
    return reports::CompareSummaries(directory + "/baseline", directory + "/current", {});
  };
  const auto within = compare(850);
  EXPECT_EQ(within.regressions, 0);
  EXPECT_EQ(within.rows[0].throughput_limit, "-20.0%");
  EXPECT_EQ(within.rows[0].verdict, "warning");
  EXPECT_EQ(within.rows[0].notes, "tokens/s limit capped at -20% (3 x the baseline's 40.0% spread over 1 run's timed "
                                  "steps would allow -120%): this runner's noise may cross it; record the baseline "
                                  "again on a quieter runner");
  const auto half = compare(500);
  EXPECT_EQ(half.regressions, 1);
  EXPECT_EQ(half.rows[0].notes, "tokens/s -50.0% (limit -20.0%: the cap; 3 x the baseline's 40.0% spread over 1 "
                                "run's timed steps is -120%)");
  // A spread of the usual size (single steps of a tiny row vary 10%; their median far less) is
  // capped without a word: no warning on every row of every run.
  noisy.summary.pp_tokens_per_s_spread = 0.10;
  reports::WriteReports(directory + "/baseline", {noisy});
  const auto usual = compare(850);
  EXPECT_EQ(usual.rows[0].throughput_limit, "-20.0%");
  EXPECT_EQ(usual.rows[0].verdict, "ok") << usual.rows[0].notes;
  EXPECT_EQ(compare(790).rows[0].notes, "tokens/s -21.0% (limit -20.0%: the cap; 3 x the baseline's 10.0% spread over 1 "
                                        "run's timed steps is -30%)");
  // An explicit --max-slowdown above the cap is the user's to take.
  reports::CompareOptions loose;
  loose.max_slowdown = 0.6;
  reports::WriteReports(directory + "/current", {Row("s", "PASS", "pass", 500, 5e6, 1e-15)});
  EXPECT_EQ(reports::CompareSummaries(directory + "/baseline", directory + "/current", loose).regressions, 0);
}

// One run's spread is over its timed steps, robustly: one slow step among twenty leaves it.
TEST(NoiseAwareBaseline, ARunsSpreadIsRobust) {
  std::vector<double> rates(19, 1000.0);
  for (size_t i = 0; i < rates.size(); ++i) rates[i] += (i % 2 == 0 ? 10.0 : -10.0);
  rates.push_back(300.0);
  EXPECT_NEAR(reports::RobustSpread(rates), 1.4826 * 10.0 / 1000.0, 1e-12);
  EXPECT_TRUE(std::isnan(reports::RobustSpread({1000.0})));
}

TEST(ParseCsv, QuotedFieldsAndLineEndings) {
  const auto records = reports::ParseCsv("a,b\r\n\"x, \"\"y\"\"\",\"two\nlines\"\n,\n", "t.csv");
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[1], (std::vector<std::string>{"x, \"y\"", "two\nlines"}));
  EXPECT_EQ(records[2], (std::vector<std::string>{"", ""}));
  EXPECT_THROW(reports::ParseCsv("\"open", "t.csv"), std::runtime_error);
}

}  // namespace
}  // namespace pipecheck
