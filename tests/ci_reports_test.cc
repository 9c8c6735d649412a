// CI's views of a run: JUnit XML (one testcase per scenario, outcome by status and
// expectation) and the Markdown summary, from summary rows as a run writes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "reports/compare.h"
#include "reports/junit.h"
#include "reports/markdown.h"
#include "reports/report.h"
#include "reports/trace.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

constexpr auto Row = &testing::SummaryRow;

// Every outcome, from summary rows as a run writes them; the counts are those of the cases.
TEST(JUnit, EachStatusIsItsOutcomeAndTheCountsAgree) {
  auto skipped = Row("no_gpus", "SKIPPED", "pass", 0, 0, 0);
  skipped.summary.message = "transport nccl needs a GPU per rank: 4 ranks on this host, 1 GPU";
  skipped.summary.ok = true;  // a run counts SKIPPED as meeting expect=pass (the host cannot run it)
  auto errored = Row("crashed", "ERROR", "pass", 0, 0, 0);
  errored.summary.message = "rank 1 was killed by signal 6 <Aborted> & \"more\"";
  auto timed_out = Row("hung", "TIMEOUT", "pass", 0, 0, 0);
  auto caught = Row("fault", "FAIL", "fail", 900, 4e6, 0.5);
  auto missed = Row("fault_missed", "PASS", "fail", 900, 4e6, 1e-15);
  auto passes = Row("ok", "PASS", "pass", 1000, 5e6, 1e-15);
  passes.summary.wall_s = 2.5;
  std::vector<reports::JUnitCase> cases;
  for (const auto* report : {&passes, &skipped, &errored, &timed_out, &caught, &missed}) {
    cases.push_back(reports::RunCase(*report, "suite.csv", nullptr));
  }
  using Outcome = reports::JUnitCase::Outcome;
  EXPECT_EQ(cases[0].outcome, Outcome::kPass);
  EXPECT_EQ(cases[0].seconds, 2.5);
  EXPECT_EQ(cases[1].outcome, Outcome::kSkipped);
  EXPECT_EQ(cases[2].outcome, Outcome::kError);
  EXPECT_EQ(cases[2].type, "ERROR");
  EXPECT_EQ(cases[3].outcome, Outcome::kError);
  EXPECT_EQ(cases[3].type, "TIMEOUT");
  EXPECT_EQ(cases[4].outcome, Outcome::kPass);  // expect=fail met
  EXPECT_EQ(cases[5].outcome, Outcome::kFailure);
  EXPECT_EQ(cases[5].message, "expected fail, but it passed: the injected fault was not caught");

  // A regression against the baseline fails a scenario that met its expectation.
  reports::ComparisonRow regression;
  regression.scenario = "ok";
  regression.verdict = "REGRESSION";
  regression.notes = "tokens/s -25.0% (limit -10.0%)";
  const auto regressed = reports::RunCase(passes, "suite.csv", &regression);
  EXPECT_EQ(regressed.outcome, Outcome::kFailure);
  EXPECT_EQ(regressed.type, "regression");

  const std::string xml = reports::JUnitXml("pipecheck run suite.csv", cases);
  const std::string counts = "tests=\"6\" failures=\"1\" errors=\"2\" skipped=\"1\"";
  EXPECT_NE(xml.find("<testsuites name=\"pipecheck\" " + counts), std::string::npos) << xml;
  EXPECT_NE(xml.find("<testsuite name=\"pipecheck run suite.csv\" " + counts), std::string::npos) << xml;
  EXPECT_NE(xml.find("<skipped message=\"transport nccl needs a GPU per rank"), std::string::npos) << xml;
  EXPECT_NE(xml.find("killed by signal 6 &lt;Aborted&gt; &amp; &quot;more&quot;"), std::string::npos) << xml;
  EXPECT_EQ(xml.find("<Aborted>"), std::string::npos);
  EXPECT_EQ(reports::XmlEscape("a\nb\x01"), "a&#10;b?");
}

// What `compare` says of a row, `run --runner`'s Markdown and JUnit say too: a warning's text, the
// limit, the headline's mark, the rows --only left out.
TEST(Markdown, RunCarriesTheComparisonsWarningsLimitsAndLeftOutRows) {
  const auto ok = Row("steady", "PASS", "pass", 1000, 5e6, 1e-15);
  const auto drifting = Row("drifting", "PASS", "pass", 500, 5e6, 1e-15);
  reports::Comparison comparison;
  reports::ComparisonRow steady;
  steady.scenario = "steady";
  steady.verdict = "ok";
  steady.throughput_change = "+1.0%";
  steady.throughput_limit = "-16.0%";
  reports::ComparisonRow warned;
  warned.scenario = "drifting";
  warned.verdict = "warning";
  warned.throughput_change = "-50.0%";
  warned.throughput_limit = "not gated";
  warned.notes = "tokens/s -50.0%, not gated: the baseline recorded no spread";
  comparison.rows = {steady, warned};
  comparison.warnings = 1;
  comparison.left_out = 3;
  comparison.only = "s*,d*";
  const std::string text = reports::RunMarkdown("suite.csv", {ok, drifting}, &comparison, "BL/box");
  EXPECT_EQ(text.rfind("### ⚠️ pipecheck run `suite.csv`: 2 of 2 scenarios met their expectation, 0 regression(s), "
                       "1 warning(s) against `BL/box`", 0), 0u) << text;
  EXPECT_NE(text.find("- ⚠️ **drifting**: tokens/s -50.0%, not gated"), std::string::npos) << text;
  EXPECT_NE(text.find("| limit |"), std::string::npos) << text;
  EXPECT_NE(text.find("| -16.0% |"), std::string::npos) << text;
  EXPECT_NE(text.find("| not gated |"), std::string::npos) << text;
  EXPECT_NE(text.find("3 baseline scenario(s) left out: not selected by --only 's*,d*'"), std::string::npos) << text;
  const auto compare_text = reports::CompareMarkdown(comparison, "BL/box", "latest");
  EXPECT_EQ(compare_text.rfind("### ⚠️ pipecheck compare", 0), 0u) << compare_text;
  EXPECT_NE(compare_text.find("3 baseline scenario(s) left out"), std::string::npos) << compare_text;
  // Without warnings the headline is a tick; without a comparison there is no limit column.
  comparison.rows = {steady};
  comparison.warnings = 0;
  EXPECT_EQ(reports::RunMarkdown("suite.csv", {ok}, &comparison, "BL/box").rfind("### ✅", 0), 0u);
  EXPECT_EQ(reports::RunMarkdown("suite.csv", {ok}, nullptr, "").find("limit"), std::string::npos);

  const auto junit = reports::RunCase(drifting, "suite.csv", &warned);
  EXPECT_EQ(junit.outcome, reports::JUnitCase::Outcome::kPass);
  const auto notes = std::find_if(junit.properties.begin(), junit.properties.end(),
                                  [](const auto& p) { return p.first == "baseline_notes"; });
  ASSERT_NE(notes, junit.properties.end());
  EXPECT_EQ(notes->second, warned.notes);
}

// The timeline picture says what it shows ("1 rank", and which replica of several) and keeps its
// legend inside the picture when the all-reduce entry makes it longer than one row.
TEST(TimelineSvg, TitleSaysRanksAndReplicaAndTheLegendStaysInside) {
  reports::ScenarioReport report;
  report.summary.scenario = "dp";
  report.summary.data_parallel = 2;
  for (const char* action : {"F", "B", "ALLREDUCE"}) {
    reports::TimelineRow row;
    row.scenario = "dp";
    row.action = action;
    row.stage = std::string(action) == "ALLREDUCE" ? -1 : 0;
    row.start_us = 100.0 * static_cast<double>(report.timeline.size());
    row.end_us = row.start_us + 90;
    row.wait_start_us = row.start_us;
    row.step_start_us = 0.0;
    report.timeline.push_back(row);
  }
  const std::string svg = reports::TimelineSvg(report);
  EXPECT_NE(svg.find("dp — 0.3 ms, 1 rank, replica 0 of 2 (every replica runs the same actions)</text>"),
            std::string::npos) << svg;
  EXPECT_EQ(svg.find("1 ranks"), std::string::npos);
  const auto width_at = svg.find("width=\"");
  const double width = std::stod(svg.substr(width_at + 7));
  const std::string opening = "<text class=\"legend\" x=\"";
  size_t at = 0, entries = 0;
  while ((at = svg.find(opening, at)) != std::string::npos) {
    at += opening.size();
    const double x = std::stod(svg.substr(at));
    const size_t open = svg.find('>', at) + 1, close = svg.find("</text>", open);
    const double text_width = 7.0 * static_cast<double>(close - open);
    EXPECT_LE(x + text_width, width) << svg.substr(open, close - open) << " runs past the picture (" << width << ")";
    ++entries;
  }
  EXPECT_EQ(entries, 8u);  // six kinds, the all-reduce, the blank's meaning
}

TEST(Markdown, ArrowsShowTheDirection) {
  EXPECT_EQ(reports::Arrow("+3.1%"), "▲ +3.1%");
  EXPECT_EQ(reports::Arrow("-12.0%"), "▼ -12.0%");
  EXPECT_EQ(reports::Arrow("+0.0%"), "= +0.0%");
  EXPECT_EQ(reports::Arrow(""), "");
}

}  // namespace
}  // namespace pipecheck
