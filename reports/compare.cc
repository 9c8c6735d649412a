// Baseline comparison of summaries (see compare.h).
#include "reports/compare.h"

#include "reports/csv.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <libfccp/csv.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace pipecheck::reports {
namespace {

struct SummaryEntry {
  std::string scenario, status, expect, ok, tokens_per_s, peak_bytes, grad_rel_err;
  unsigned line = 0;
};

using Reader = io::CSVReader<7, io::trim_chars<' ', '\t'>, io::double_quote_escape<',', '"'>>;

std::map<std::string, SummaryEntry> ReadSummary(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw CompareError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream contents;
  contents << stream.rdbuf();
  const std::string text = contents.str();
  std::map<std::string, SummaryEntry> entries;
  try {
    Reader reader(path, text.data(), text.data() + text.size());
    reader.read_header(io::ignore_extra_column, "scenario", "status", "expect", "ok", "pp_tokens_per_s",
                       "pp_peak_bytes_max", "grad_max_rel_err");
    SummaryEntry entry;
    while (reader.read_row(entry.scenario, entry.status, entry.expect, entry.ok, entry.tokens_per_s,
                           entry.peak_bytes, entry.grad_rel_err)) {
      entry.line = reader.get_file_line();
      auto [previous, inserted] = entries.emplace(entry.scenario, entry);
      if (!inserted) {
        throw CompareError(fmt::format("{}:{}: scenario '{}' appears twice (first on line {})", path, entry.line,
                                       entry.scenario, previous->second.line));
      }
    }
  } catch (const io::error::missing_column_in_header& error) {
    throw CompareError(fmt::format("{}: not a pipecheck summary: column '{}' is missing", path, error.column_name));
  } catch (const io::error::base& error) {
    throw CompareError(fmt::format("{}: {}", path, error.what()));
  }
  return entries;
}

// A measured number (finite, >= 0, decimal), or NaN for an empty cell; anything else is bad input.
double Measured(const SummaryEntry& entry, const std::string& value, const char* column, const std::string& path) {
  if (value.empty() || value == "nan") return std::nan("");
  double number = 0.0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, number);
  if (ec == std::errc() && ptr == end && std::isfinite(number) && number >= 0.0) return number;
  throw CompareError(fmt::format("{}:{}: column '{}', value '{}': expected a finite decimal number >= 0 (or empty)",
                                 path, entry.line, column, value));
}

int Severity(const std::string& status) {
  if (status == "PASS") return 0;
  if (status == "SKIPPED") return 1;  // PASS -> SKIPPED is a regression: the check no longer ran
  if (status == "FAIL") return 2;
  if (status == "TIMEOUT") return 3;
  return 4;  // ERROR and anything unknown
}

std::vector<const SummaryEntry*> InFileOrder(const std::map<std::string, SummaryEntry>& entries) {
  std::vector<const SummaryEntry*> ordered;
  for (const auto& [name, entry] : entries) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) { return a->line < b->line; });
  return ordered;
}

std::string Percent(double change) { return std::isnan(change) ? "" : fmt::format("{:+.1f}%", 100.0 * change); }

}  // namespace

std::string SummaryPath(const std::string& path) {
  if (std::filesystem::is_directory(path)) return (std::filesystem::path(path) / "summary.csv").string();
  return path;
}

std::vector<std::string> ScenariosNotOk(const std::string& path) {
  std::vector<std::string> names;
  for (const auto* entry : InFileOrder(ReadSummary(SummaryPath(path)))) {
    if (entry->ok != "1") names.push_back(entry->scenario);
  }
  return names;
}

std::vector<std::string> PromoteToBaseline(const std::string& run_path, const std::string& baseline_directory,
                                           bool allow_not_ok) {
  const std::string summary = SummaryPath(run_path);
  const auto not_ok = ScenariosNotOk(summary);  // also proves it is a readable pipecheck summary
  if (!not_ok.empty() && !allow_not_ok) {
    throw CompareError(fmt::format("{}: {} scenario(s) did not meet their expectation ({}); a baseline must be a "
                                   "good run (pass --allow-failures to promote it anyway)",
                                   summary, not_ok.size(), fmt::join(not_ok, ", ")));
  }
  std::filesystem::create_directories(baseline_directory);
  const auto source = std::filesystem::path(summary).parent_path();
  std::vector<std::string> written;
  for (const char* name : {"summary.csv", "params.csv", "steps.csv", "ranks.csv"}) {
    const auto from = source / name;
    if (!std::filesystem::exists(from)) continue;
    std::ifstream stream(from, std::ios::binary);
    std::stringstream contents;
    contents << stream.rdbuf();
    const auto to = (std::filesystem::path(baseline_directory) / name).string();
    WriteFileAtomically(to, contents.str());
    written.push_back(to);
  }
  return written;
}

const std::vector<std::string>& ComparisonColumns() {
  static const std::vector<std::string> columns = {
      "scenario", "verdict", "baseline_status", "current_status", "baseline_tokens_per_s", "current_tokens_per_s",
      "throughput_change", "baseline_peak_bytes", "current_peak_bytes", "memory_change", "baseline_grad_rel_err",
      "current_grad_rel_err", "notes"};
  return columns;
}

std::vector<std::string> ComparisonFields(const ComparisonRow& r) {
  return {r.scenario, r.verdict, r.baseline_status, r.current_status, r.baseline_tokens_per_s,
          r.current_tokens_per_s, r.throughput_change, r.baseline_peak_bytes, r.current_peak_bytes, r.memory_change,
          r.baseline_grad_rel_err, r.current_grad_rel_err, r.notes};
}

Comparison CompareSummaries(const std::string& baseline_path, const std::string& current_path,
                            const CompareOptions& options) {
  const std::string baseline_file = SummaryPath(baseline_path), current_file = SummaryPath(current_path);
  const auto baseline = ReadSummary(baseline_file);
  const auto current = ReadSummary(current_file);
  Comparison comparison;
  // Rows in suite order: the baseline's, then scenarios new in the current run in its order.
  for (const auto* entry : InFileOrder(baseline)) {
    const std::string& name = entry->scenario;
    const SummaryEntry& base = *entry;
    ComparisonRow row;
    row.scenario = name;
    row.baseline_status = base.status;
    row.baseline_tokens_per_s = base.tokens_per_s;
    row.baseline_peak_bytes = base.peak_bytes;
    row.baseline_grad_rel_err = base.grad_rel_err;
    std::vector<std::string> regressions, warnings;
    auto found = current.find(name);
    if (found == current.end()) {
      regressions.push_back("missing from the current run");
    } else {
      const auto& now = found->second;
      row.current_status = now.status;
      row.current_tokens_per_s = now.tokens_per_s;
      row.current_peak_bytes = now.peak_bytes;
      row.current_grad_rel_err = now.grad_rel_err;
      if (base.ok == "1" && now.ok != "1") {
        regressions.push_back(fmt::format("no longer meets expect={}: {} -> {}", now.expect, base.status, now.status));
      } else if (base.expect == "pass" && Severity(now.status) > Severity(base.status)) {
        regressions.push_back(fmt::format("status worse: {} -> {}", base.status, now.status));
      }
      const double base_rate = Measured(base, base.tokens_per_s, "pp_tokens_per_s", baseline_file);
      const double now_rate = Measured(now, now.tokens_per_s, "pp_tokens_per_s", current_file);
      const double rate_change = base_rate > 0 ? now_rate / base_rate - 1.0 : std::nan("");
      row.throughput_change = Percent(rate_change);
      if (rate_change < -options.max_slowdown) {
        regressions.push_back(fmt::format("tokens/s {} (limit -{:.0f}%)", Percent(rate_change), 100 * options.max_slowdown));
      }
      const double base_bytes = Measured(base, base.peak_bytes, "pp_peak_bytes_max", baseline_file);
      const double now_bytes = Measured(now, now.peak_bytes, "pp_peak_bytes_max", current_file);
      const double memory_change = base_bytes > 0 ? now_bytes / base_bytes - 1.0 : std::nan("");
      row.memory_change = Percent(memory_change);
      if (memory_change > options.max_memory_growth) {
        regressions.push_back(fmt::format("peak memory {} (limit +{:.0f}%)", Percent(memory_change),
                                          100 * options.max_memory_growth));
      }
      const double base_error = Measured(base, base.grad_rel_err, "grad_max_rel_err", baseline_file);
      const double now_error = Measured(now, now.grad_rel_err, "grad_max_rel_err", current_file);
      if (now.status == "PASS" && base_error > 0 && now_error > 10 * base_error) {
        warnings.push_back(fmt::format("gradient error grew {:.0f}x ({:.3g} -> {:.3g}), still passing",
                                       now_error / base_error, base_error, now_error));
      }
    }
    std::vector<std::string> notes = regressions;
    notes.insert(notes.end(), warnings.begin(), warnings.end());
    row.notes = fmt::format("{}", fmt::join(notes, "; "));
    row.verdict = !regressions.empty() ? "REGRESSION" : (!warnings.empty() ? "warning" : "ok");
    comparison.regressions += !regressions.empty();
    comparison.warnings += regressions.empty() && !warnings.empty();
    comparison.rows.push_back(row);
  }
  for (const auto* entry : InFileOrder(current)) {
    const std::string& name = entry->scenario;
    const SummaryEntry& now = *entry;
    if (baseline.count(name)) continue;
    ComparisonRow row;
    row.scenario = name;
    row.verdict = "new";
    row.current_status = now.status;
    row.current_tokens_per_s = now.tokens_per_s;
    row.current_peak_bytes = now.peak_bytes;
    row.current_grad_rel_err = now.grad_rel_err;
    row.notes = "not in the baseline";
    comparison.rows.push_back(row);
  }
  return comparison;
}

}  // namespace pipecheck::reports
