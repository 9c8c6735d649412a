// `pipecheck compare`: today's summary.csv held against a baseline, joined on scenario, the way
// CI uses it to fail on regressions: an expectation no longer met or a worse status, tokens/s
// down or peak memory up past a threshold, a scenario gone missing. A parity error that grew
// more than tenfold while still passing is a warning, not a regression.
// Noise-aware where the baseline recorded its spread (several runs merged by `baseline update`, or
// one run's timed steps): a throughput limit never tighter than the noise it has seen.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "reports/report.h"

namespace pipecheck::reports {

// Unreadable or malformed input to compare (exit code 2).
class CompareError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The most the baseline's noise may widen the tokens/s limit (see CompareOptions::noise_factor).
constexpr double kNoiseLimitCap = 0.20;

struct CompareOptions {
  double max_slowdown = 0.10;       // fraction of baseline tokens/s that may be lost
  double max_memory_growth = 0.10;  // fraction of baseline peak bytes that may be added
  // Noise-aware throughput: a scenario whose baseline recorded a spread s (pp_tokens_per_s_spread:
  // a robust standard deviation relative to the median, over one run's timed steps or merged
  // runs) may lose max(max_slowdown, noise_factor x s) of its tokens/s, but never more than
  // max(max_slowdown, kNoiseLimitCap): past the cap a warning says the baseline is too noisy. A
  // baseline row without a spread (a trainer that timed one step) does not gate tokens/s: a drop
  // past max_slowdown is a warning.
  double noise_factor = 3.0;
  // Shell globs on scenario names (`--only`, comma-separated): only the rows they select, on
  // either side, are compared; the baseline's others are left out (counted), not missing. A glob
  // that selects no row on either side is bad input. Empty: every row.
  std::string only;
  // `run --only GLOBS`: the scenarios the run selected, by name (they are compared, the baseline's
  // others left out), and the globs as given, for messages.
  std::vector<std::string> ran;
  std::string only_as_given;
};

struct ComparisonRow {
  std::string scenario;
  std::string verdict;  // ok, REGRESSION, CHANGED (another configuration: not comparable), warning, new
  std::string baseline_status, current_status;  // "" where that side has no row
  std::optional<double> baseline_tokens_per_s, current_tokens_per_s;
  std::string throughput_change;  // "+1.0%"
  std::string throughput_limit;   // the slowdown allowed, noise included: "-16.0%"
  std::optional<int64_t> baseline_peak_bytes, current_peak_bytes;
  std::string memory_change;
  std::optional<double> baseline_grad_rel_err, current_grad_rel_err;
  std::string notes;
  // Not a column: its one regression is tokens/s past the limit, which `run` confirms by timing
  // the scenario again before it calls it a regression (a moment's noise is not).
  bool slower_only = false;
};

// compare.csv's columns, in file order: the one list.
const Fields<ComparisonRow>& ComparisonFields();

struct Comparison {
  std::vector<ComparisonRow> rows;
  int regressions = 0;      // rows that fail the comparison: REGRESSION and CHANGED
  int changed = 0;          // of those, CHANGED: the scenario's configuration differs from the baseline's
  int warnings = 0;
  int unfingerprinted = 0;  // baseline rows without a configuration fingerprint (older baselines)
  int left_out = 0;         // baseline rows --only did not select: not compared
  std::string only;         // the --only globs, "" for every row
};

// A row that fails the comparison: a regression, or a changed configuration.
inline bool Fails(const ComparisonRow& row) { return row.verdict == "REGRESSION" || row.verdict == "CHANGED"; }

// `path` is a summary.csv or a directory holding one.
std::string SummaryPath(const std::string& path);

// Throws CompareError for unreadable files, missing columns, duplicate scenarios, bad numbers.
Comparison CompareSummaries(const std::string& baseline_path, const std::string& current_path,
                            const CompareOptions& options);

// The same, with the current run's rows in memory (as RunSuite holds them; `current_name` names
// them in messages, e.g. its summary.csv).
Comparison CompareWithBaseline(const std::string& baseline_path, const std::vector<ScenarioReport>& current,
                               const std::string& current_name, const CompareOptions& options);

// Scenarios of a summary whose status did not meet their expectation (ok != 1), in file order.
// Throws CompareError like CompareSummaries.
std::vector<std::string> ScenariosNotOk(const std::string& path);

// PASS scenarios of a summary that recorded no tokens/s spread (one run with fewer than two
// timed steps): `compare` cannot gate their throughput, and `baseline update` says so.
std::vector<std::string> ScenariosWithoutSpread(const std::string& path);

// `pipecheck baseline update`: copies reviewed runs' reports (summary.csv and whichever of
// params, steps and ranks exist; timeline.csv is timing noise) into `baseline_directory`, each
// atomically. Several runs of the same suite are merged: per scenario the row of the run with
// the most tokens/s, with pp_tokens_per_s_spread = the larger of the runs' robust spread
// (RobustSpread of their tokens/s) and the median of their own spreads, and
// pp_tokens_per_s_runs = their number; the other files come from the first run. Refuses runs with
// scenarios that did not meet their expectation unless `allow_not_ok`, and runs whose scenarios
// differ. Returns the files written.
std::vector<std::string> PromoteToBaseline(const std::vector<std::string>& run_paths,
                                           const std::string& baseline_directory, bool allow_not_ok);

// `directory/runner`, the baseline of one runner; throws CompareError for a runner name that is
// not a plain folder name ([A-Za-z0-9._-], not starting with a dot).
std::string RunnerBaseline(const std::string& directory, const std::string& runner);

// "N baseline scenario(s) left out: not selected by --only 'GLOBS'".
std::string LeftOutNote(const Comparison& comparison);

// The comparison as `compare` prints it: a table, then a line of totals and limits.
std::string FormatComparison(const Comparison& comparison, const CompareOptions& options);
// compare.csv's text.
std::string ComparisonCsv(const Comparison& comparison);

const std::vector<std::string>& ComparisonColumns();


}  // namespace pipecheck::reports
