// Markdown summaries (see markdown.h).
#include "reports/markdown.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "reports/csv.h"

namespace pipecheck::reports {
namespace {

// A table cell: pipes escaped, line breaks folded, long text cut.
std::string Cell(const std::string& text, size_t limit = 200) {
  std::string cell;
  for (char c : text) {
    if (c == '|') {
      cell += "\\|";
    } else if (c == '\n' || c == '\r') {
      cell += ' ';
    } else {
      cell += c;
    }
  }
  if (cell.size() > limit) cell = cell.substr(0, limit) + "…";
  return cell;
}

// "–" where nothing was measured (or it measured NaN).
std::string Number(const std::optional<double>& value, const char* format) {
  if (!value || std::isnan(*value)) return "–";
  return fmt::format(fmt::runtime(format), *value);
}

std::string Bytes(const std::optional<int64_t>& value) {
  if (!value || *value < 0) return "–";
  const double bytes = static_cast<double>(*value);
  if (bytes >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", bytes / 1024.0);
}

// A headline's or row's mark: a failure, else a warning, else a tick.
const char* Mark(bool failed, bool warned) { return failed ? "❌" : (warned ? "⚠️" : "✅"); }

}  // namespace

std::string Arrow(const std::string& percent) {
  if (percent.empty()) return "";
  try {
    const double value = std::stod(percent);
    const char* arrow = value > 0.05 ? "▲" : (value < -0.05 ? "▼" : "=");
    return fmt::format("{} {}", arrow, percent);
  } catch (const std::exception&) {
    return Cell(percent);
  }
}

namespace {

// The comparison's row of each scenario compared.
using Compared = std::map<std::string, const ComparisonRow*>;

const ComparisonRow* RowOf(const Compared& compared, const std::string& scenario) {
  const auto found = compared.find(scenario);
  return found == compared.end() ? nullptr : found->second;
}

// The failures first, each with its message; then the comparison's warnings (a drop that could
// not be gated, a parity error that grew).
std::string Problems(const std::vector<ScenarioReport>& reports, const Compared& compared) {
  std::string text;
  for (const auto& report : reports) {
    const SummaryRow& r = report.summary;
    const ComparisonRow* row = RowOf(compared, r.scenario);
    const bool regressed = row != nullptr && Fails(*row);
    if (r.ok && !regressed) continue;
    text += fmt::format("- ❌ **{}**", Cell(r.scenario));
    if (!r.ok) text += fmt::format(" (expected {}, got {}): {}", r.expect, StatusName(r.status), Cell(r.message, 600));
    if (regressed) text += fmt::format("{}regression: {}", r.ok ? ": " : "; ", Cell(row->notes, 600));
    text += "\n";
  }
  for (const auto& report : reports) {
    const ComparisonRow* row = RowOf(compared, report.summary.scenario);
    if (row == nullptr || row->verdict != "warning") continue;
    text += fmt::format("- ⚠️ **{}**: {}\n", Cell(report.summary.scenario), Cell(row->notes, 600));
  }
  return text;
}

// One scenario's line of the table; `row` its comparison (null: none), `compared` whether the
// table has the comparison's columns.
std::string TableLine(const SummaryRow& r, const ComparisonRow* row, bool compared) {
  const char* mark = Mark(!r.ok || (row && Fails(*row)), row && row->verdict == "warning");
  // Another trainer's row says whose it is, beside pipecheck's rows on the same work.
  std::string who = r.trainer == "pipecheck" ? "" : fmt::format(" ({})", Cell(r.trainer));
  // The layout beside the name: replicas and recomputation change what the row measures.
  if (r.data_parallel > 1) who += fmt::format(" ×{} replicas", r.data_parallel);
  if (r.recompute) who += " (recompute)";
  if (r.accumulation > 1) who += fmt::format(" ×{} rounds", r.accumulation);
  std::string text = fmt::format("| {} | {}{} | {} | {} | {} | {} ", mark, Cell(r.scenario), who, StatusName(r.status),
                                 Number(r.loss_max_abs_diff, "{:.1e}"), Number(r.grad_max_rel_err, "{:.1e}"),
                                 Number(r.pp_tokens_per_s, "{:.0f}"));
  if (!compared) return text + fmt::format("| {} |\n", Bytes(r.pp_peak_bytes_max));
  return text + fmt::format("| {} | {} | {} | {} |\n", row ? Arrow(row->throughput_change) : "",
                            row ? Cell(row->throughput_limit) : "", Bytes(r.pp_peak_bytes_max),
                            row ? Arrow(row->memory_change) : "");
}

}  // namespace

std::string RunMarkdown(const std::string& suite, const std::vector<ScenarioReport>& reports,
                        const Comparison* comparison, const std::string& baseline) {
  Compared compared;
  if (comparison) {
    for (const auto& row : comparison->rows) compared[row.scenario] = &row;
  }
  int not_ok = 0, regressions = comparison ? comparison->regressions : 0;
  const int warnings = comparison ? comparison->warnings : 0;
  for (const auto& report : reports) not_ok += !report.summary.ok;
  const bool failed = not_ok > 0 || regressions > 0;
  std::string text = fmt::format("### {} pipecheck run `{}`: {} of {} scenarios met their expectation",
                                 Mark(failed, warnings > 0), Cell(suite), reports.size() - not_ok,
                                 reports.size());
  if (comparison) {
    text += fmt::format(", {} regression(s), {} warning(s) against `{}`", regressions, warnings, Cell(baseline));
  }
  text += "\n\n";
  if (comparison && comparison->left_out > 0) text += Cell(LeftOutNote(*comparison), 600) + "\n\n";
  text += Problems(reports, compared);
  if (failed || warnings > 0) text += "\n";
  if (comparison) {
    text += "| | scenario | status | loss diff | grad rel err | tokens/s | vs baseline | limit | peak memory | vs baseline |\n";
    text += "|---|---|---|---:|---:|---:|---|---:|---:|---|\n";
  } else {
    text += "| | scenario | status | loss diff | grad rel err | tokens/s | peak memory |\n";
    text += "|---|---|---|---:|---:|---:|---:|\n";
  }
  for (const auto& report : reports) {
    text += TableLine(report.summary, RowOf(compared, report.summary.scenario), comparison != nullptr);
  }
  return text;
}

std::string CompareMarkdown(const Comparison& comparison, const std::string& baseline, const std::string& current) {
  std::string text = fmt::format("### {} pipecheck compare: {} scenarios, {} regression(s), {} warning(s)\n\n`{}` → `{}`\n\n",
                                 Mark(comparison.regressions > 0, comparison.warnings > 0), comparison.rows.size(), comparison.regressions,
                                 comparison.warnings, Cell(baseline), Cell(current));
  if (comparison.left_out > 0) text += Cell(LeftOutNote(comparison), 600) + "\n\n";
  for (const auto& row : comparison.rows) {
    if (Fails(row)) text += fmt::format("- ❌ **{}**: {}\n", Cell(row.scenario), Cell(row.notes, 600));
  }
  if (comparison.regressions > 0) text += "\n";
  text += "| | scenario | verdict | status | tokens/s | vs baseline | limit | peak memory | vs baseline | notes |\n";
  text += "|---|---|---|---|---:|---|---:|---:|---|---|\n";
  for (const auto& row : comparison.rows) {
    const std::string status = row.baseline_status == row.current_status || row.baseline_status.empty() ||
                                       row.current_status.empty()
                                   ? (row.current_status.empty() ? row.baseline_status + " → missing" : row.current_status)
                                   : row.baseline_status + " → " + row.current_status;
    text += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        Mark(Fails(row), row.verdict == "warning"), Cell(row.scenario),
                        row.verdict, status, Number(row.current_tokens_per_s, "{:.0f}"), Arrow(row.throughput_change),
                        row.throughput_limit, Bytes(row.current_peak_bytes), Arrow(row.memory_change), Cell(row.notes));
  }
  return text;
}

bool WriteMarkdown(const std::string& path, const std::string& text) {
  const char* step_summary = std::getenv("GITHUB_STEP_SUMMARY");
  std::error_code error;
  const bool append = step_summary && *step_summary &&
                      (path == step_summary || (std::filesystem::exists(path, error) &&
                                                std::filesystem::equivalent(path, step_summary, error)));
  if (!append) {
    WriteFileAtomically(path, text);
    return false;
  }
  std::ofstream file(path, std::ios::app | std::ios::binary);
  file << text << "\n";
  file.flush();
  if (!file) throw std::runtime_error(fmt::format("cannot append to {}: {}", path, std::strerror(errno)));
  return true;
}

}  // namespace pipecheck::reports
