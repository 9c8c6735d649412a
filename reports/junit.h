// JUnit XML, the test-report format GitLab, Jenkins, Buildkite, Azure Pipelines and GitHub's
// test-report actions read: one <testsuite> per run, one <testcase> per scenario (or per
// compared scenario), with <failure> for a missed expectation or a regression, <error> for a
// scenario that errored or timed out, <skipped> for one the host could not run, and the key
// figures as <properties>. The counts on <testsuites> and <testsuite> are those of its cases.
// Not a general XML writer: escaping covers what our messages can hold.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "reports/compare.h"
#include "reports/report.h"

namespace pipecheck::reports {

struct JUnitCase {
  enum class Outcome { kPass, kFailure, kError, kSkipped };
  std::string classname;  // the suite file (run) or "compare BASELINE" (compare)
  std::string name;       // the scenario
  double seconds = 0.0;
  Outcome outcome = Outcome::kPass;
  std::string type;     // the failure's or error's kind: FAIL, ERROR, TIMEOUT, regression, ...
  std::string message;  // one line, for the attribute; the element's text holds it too
  std::vector<std::pair<std::string, std::string>> properties;
};

// One scenario of a run: its summary row (wall_s for the time) and, when the run was compared
// with a baseline, its comparison row (a regression is a failure); `comparison` may be null.
JUnitCase RunCase(const ScenarioReport& report, const std::string& suite, const ComparisonRow* comparison);

// One compared scenario: REGRESSION is a failure, the rest pass (notes in the properties).
JUnitCase CompareCase(const ComparisonRow& row, const std::string& baseline);

// The document: <testsuites> holding one <testsuite name=`suite_name`> of `cases`.
std::string JUnitXml(const std::string& suite_name, const std::vector<JUnitCase>& cases);

// Text safe inside an XML attribute or element: & < > " ' escaped, line breaks and tabs as
// character references, characters XML 1.0 forbids replaced by '?'.
std::string XmlEscape(const std::string& text);

}  // namespace pipecheck::reports
