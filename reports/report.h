// The rows one scenario contributes to the run's reports, with the column sets docs/reports.md
// describes defined once, and the writers for summary.csv, params.csv, steps.csv, ranks.csv,
// timeline.csv, boundaries.csv and comm.csv. A failed or crashed scenario keeps its summary row
// with every column (unmeasured ones empty) and its message filled. Not a judge of parity: the
// harness fills the rows.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pipecheck::reports {

const std::vector<std::string>& SummaryColumns();
const std::vector<std::string>& ParamColumns();
const std::vector<std::string>& StepColumns();
const std::vector<std::string>& TimelineColumns();
const std::vector<std::string>& RankColumns();
const std::vector<std::string>& BoundaryColumns();
const std::vector<std::string>& CommColumns();

struct ScenarioReport {
  std::map<std::string, std::string> summary;       // SummaryColumns() -> value ("" when unmeasured)
  std::vector<std::vector<std::string>> params;     // rows in ParamColumns() order
  std::vector<std::vector<std::string>> steps;      // rows in StepColumns() order
  std::vector<std::vector<std::string>> timeline;   // rows in TimelineColumns() order
  std::vector<std::vector<std::string>> ranks;      // rows in RankColumns() order
  std::vector<std::vector<std::string>> boundaries; // rows in BoundaryColumns() order
  std::vector<std::vector<std::string>> comm;       // rows in CommColumns() order

  const std::string& Get(const std::string& column) const;
};

// Numbers as reports hold them: shortest text that reads back to the same double.
std::string FormatNumber(double value);

// JSON text and back, to hand a report from the rank that computed it to the launcher.
std::string ToJson(const ScenarioReport& report);
ScenarioReport FromJson(const std::string& text);

// Writes summary.csv, params.csv, steps.csv, ranks.csv, timeline.csv, boundaries.csv and comm.csv into `directory`
// atomically; returns their paths. (Each scenario's trace.json and timeline.svg are written
// once, when it finishes: reports/trace.h.)
std::vector<std::string> WriteReports(const std::string& directory, const std::vector<ScenarioReport>& reports);

}  // namespace pipecheck::reports
