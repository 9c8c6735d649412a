// `pipecheck compare`: today's summary.csv held against a baseline, joined on scenario, the way
// CI uses it to fail on regressions: an expectation no longer met or a worse status, tokens/s
// down or peak memory up past a threshold, a scenario gone missing. A parity error that grew
// more than tenfold while still passing is a warning, not a regression.
// Not a statistical test: one run against one baseline, thresholds as given.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace pipecheck::reports {

// Unreadable or malformed input to compare (exit code 2).
class CompareError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CompareOptions {
  double max_slowdown = 0.10;       // fraction of baseline tokens/s that may be lost
  double max_memory_growth = 0.10;  // fraction of baseline peak bytes that may be added
};

struct ComparisonRow {
  std::string scenario;
  std::string verdict;  // ok, REGRESSION, warning, new
  std::string baseline_status, current_status;
  std::string baseline_tokens_per_s, current_tokens_per_s, throughput_change;
  std::string baseline_peak_bytes, current_peak_bytes, memory_change;
  std::string baseline_grad_rel_err, current_grad_rel_err;
  std::string notes;
};

struct Comparison {
  std::vector<ComparisonRow> rows;
  int regressions = 0;
  int warnings = 0;
};

// `path` is a summary.csv or a directory holding one.
std::string SummaryPath(const std::string& path);

// Throws CompareError for unreadable files, missing columns, duplicate scenarios, bad numbers.
Comparison CompareSummaries(const std::string& baseline_path, const std::string& current_path,
                            const CompareOptions& options);

// Scenarios of a summary whose status did not meet their expectation (ok != 1), in file order.
// Throws CompareError like CompareSummaries.
std::vector<std::string> ScenariosNotOk(const std::string& path);

// `pipecheck baseline update`: copies a reviewed run's reports (summary.csv and whichever of
// params, steps and ranks exist; timeline.csv is timing noise) into `baseline_directory`, each atomically. Refuses a
// run with scenarios that did not meet their expectation unless `allow_not_ok`. Returns the
// files written.
std::vector<std::string> PromoteToBaseline(const std::string& run_path, const std::string& baseline_directory,
                                           bool allow_not_ok);

const std::vector<std::string>& ComparisonColumns();
std::vector<std::string> ComparisonFields(const ComparisonRow& row);

}  // namespace pipecheck::reports
