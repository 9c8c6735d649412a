// A Markdown summary of a run or a comparison, short enough for a CI job's page (GitHub Actions
// shows $GITHUB_STEP_SUMMARY; GitLab and others render it as an artifact): a headline, the
// failures' messages first, then one table row per scenario with status, parity, and speed and
// memory, against the baseline with ▲/▼ and percentages where there is one.
#pragma once

#include <string>
#include <vector>

#include "reports/compare.h"
#include "reports/report.h"

namespace pipecheck::reports {

// `comparison` (may be null): the run held against `baseline`.
std::string RunMarkdown(const std::string& suite, const std::vector<ScenarioReport>& reports,
                        const Comparison* comparison, const std::string& baseline);

std::string CompareMarkdown(const Comparison& comparison, const std::string& baseline, const std::string& current);

// "▲ +3.1%", "▼ -12.0%", "= +0.0%" for a change such as compare writes it ("+3.1%"); "" when none.
std::string Arrow(const std::string& percent);

// Writes `text` to `path`, appending when `path` is the file $GITHUB_STEP_SUMMARY names (several
// steps add to one job summary), else replacing it atomically. Returns whether it appended.
bool WriteMarkdown(const std::string& path, const std::string& text);

}  // namespace pipecheck::reports
