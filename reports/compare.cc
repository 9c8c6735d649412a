// Baseline comparison of summaries (see compare.h).
#include "reports/compare.h"

#include "reports/csv.h"
#include "reports/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fnmatch.h>
#include <fstream>
#include <map>
#include <sstream>

namespace pipecheck::reports {
namespace {

// A summary row as compare reads it: the typed row, and where it came from.
struct SummaryEntry {
  SummaryRow row;
  unsigned line = 0;
};

// The columns compare judges: a summary without one of them is not a pipecheck summary.
constexpr const char* kRequiredColumns[] = {"scenario", "status", "expect", "ok", "pp_tokens_per_s",
                                            "pp_peak_bytes_max", "grad_max_rel_err"};
// The measured columns compare gates on: finite decimal numbers >= 0, or empty.
bool Gated(const std::string& column) {
  return column == "pp_tokens_per_s" || column == "pp_peak_bytes_max" || column == "grad_max_rel_err" ||
         column == "pp_tokens_per_s_spread";
}

// Whether `text` is a measured number: finite and >= 0, or nan (measured as not a number).
bool MeasuredNumber(const std::string& column, const std::string& text) {
  try {
    const double value = cell::ParseReal(column, text);
    return std::isnan(value) || (std::isfinite(value) && value >= 0);
  } catch (const FieldError&) {
    return false;
  }
}

void TrimBlanks(std::string& text) {
  text.erase(0, text.find_first_not_of(" \t"));
  text.erase(text.find_last_not_of(" \t") + 1);
}

std::string GatedProblem(const std::string& path, unsigned line, const std::string& column, const std::string& value) {
  return fmt::format("{}:{}: column '{}', value '{}': expected a finite decimal number >= 0 (or empty)", path, line,
                     column, value);
}

// Rows keyed by scenario, each read through summary.csv's field table.
std::map<std::string, SummaryEntry> EntriesOf(const std::vector<SummaryRow>& rows, const std::vector<unsigned>& lines,
                                              const std::string& path) {
  std::map<std::string, SummaryEntry> entries;
  for (size_t i = 0; i < rows.size(); ++i) {
    auto [previous, inserted] = entries.emplace(rows[i].scenario, SummaryEntry{rows[i], lines[i]});
    if (!inserted) {
      throw CompareError(fmt::format("{}:{}: scenario '{}' appears twice (first on line {})", path, lines[i],
                                     rows[i].scenario, previous->second.line));
    }
  }
  return entries;
}

std::map<std::string, SummaryEntry> ReadSummary(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw CompareError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream contents;
  contents << stream.rdbuf();
  std::vector<std::vector<std::string>> table;
  try {
    table = ParseCsv(contents.str(), path);
  } catch (const std::exception& error) {
    throw CompareError(error.what());
  }
  if (table.empty()) throw CompareError(fmt::format("{}: not a pipecheck summary: the file is empty", path));
  auto header = table[0];
  if (!header.empty() && header[0].rfind("\xEF\xBB\xBF", 0) == 0) header[0] = header[0].substr(3);  // a byte order mark
  for (auto& name : header) TrimBlanks(name);
  for (const char* column : kRequiredColumns) {
    if (std::find(header.begin(), header.end(), column) == header.end()) {
      throw CompareError(fmt::format("{}: not a pipecheck summary: column '{}' is missing", path, column));
    }
  }
  // Older summaries lack the newer columns (spread, runs, configuration): those stay empty.
  std::vector<SummaryRow> rows;
  std::vector<unsigned> lines;
  for (size_t r = 1; r < table.size(); ++r) {
    const auto line = static_cast<unsigned>(r + 1);
    auto cells = table[r];
    for (auto& cell : cells) TrimBlanks(cell);
    for (size_t c = 0; c < header.size() && c < cells.size(); ++c) {
      if (Gated(header[c]) && !cells[c].empty() && !MeasuredNumber(header[c], cells[c])) {
        throw CompareError(GatedProblem(path, line, header[c], cells[c]));
      }
    }
    try {
      rows.push_back(ParseCells(SummaryFields(), header, cells));
    } catch (const FieldError& error) {
      throw CompareError(fmt::format("{}:{}: {}", path, line, error.what()));
    }
    lines.push_back(line);
  }
  return EntriesOf(rows, lines, path);
}

// A measured number, or NaN where nothing was measured.
double Measured(const std::optional<double>& value) { return value ? *value : std::nan(""); }
double Measured(const std::optional<int64_t>& value) {
  return value ? static_cast<double>(*value) : std::nan("");
}

// A PASS row measured its speed and memory: an empty or nan cell there is a broken file, not
// "unmeasured" (which would leave the scenario ungated).
template <typename Value>
double MeasuredOfPass(const SummaryEntry& entry, const std::optional<Value>& value, const char* column,
                      const std::string& path) {
  const double number = Measured(value);
  if (entry.row.status == Status::kPass && std::isnan(number)) {
    throw CompareError(fmt::format("{}:{}: column '{}', value '{}': a PASS row must hold its measured number (scenario "
                                   "'{}')", path, entry.line, column, CellOf(SummaryFields(), entry.row, column),
                                   entry.row.scenario));
  }
  return number;
}

// "world_size 2 -> 4, schedule 1f1b -> gpipe": the pairs of two Configuration() texts that differ.
std::string ConfigurationChanges(const std::string& before, const std::string& after) {
  auto pairs = [](const std::string& text) {
    std::map<std::string, std::string> values;
    std::vector<std::string> order;
    std::stringstream stream(text);
    std::string item;
    while (stream >> item) {
      const size_t equals = item.find('=');
      const std::string key = item.substr(0, equals);
      values[key] = equals == std::string::npos ? "" : item.substr(equals + 1);
      order.push_back(key);
    }
    return std::make_pair(values, order);
  };
  const auto [old_values, old_order] = pairs(before);
  const auto [new_values, new_order] = pairs(after);
  std::vector<std::string> changes;
  for (const auto& key : new_order) {
    const auto found = old_values.find(key);
    const std::string was = found == old_values.end() ? "(absent)" : found->second;
    if (was != new_values.at(key)) changes.push_back(fmt::format("{} {} -> {}", key, was, new_values.at(key)));
  }
  for (const auto& key : old_order) {
    if (!new_values.count(key)) changes.push_back(fmt::format("{} {} -> (absent)", key, old_values.at(key)));
  }
  return changes.empty() ? "its configuration text differs" : fmt::format("{}", fmt::join(changes, ", "));
}

int Severity(Status status) {
  switch (status) {
    case Status::kPass: return 0;
    case Status::kSkipped: return 1;  // PASS -> SKIPPED is a regression: the check no longer ran
    case Status::kFail: return 2;
    case Status::kTimeout: return 3;
    case Status::kError: return 4;
  }
  return 4;
}

std::vector<const SummaryEntry*> InFileOrder(const std::map<std::string, SummaryEntry>& entries) {
  std::vector<const SummaryEntry*> ordered;
  for (const auto& [name, entry] : entries) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) { return a->line < b->line; });
  return ordered;
}


std::string Percent(double change) {
  if (std::isnan(change)) return "";
  const double percent = std::round(1000.0 * change) / 10.0;
  return fmt::format("{:+.1f}%", percent == 0.0 ? 0.0 : percent);  // never "-0.0%"
}

}  // namespace

std::string SummaryPath(const std::string& path) {
  if (std::filesystem::is_directory(path)) return (std::filesystem::path(path) / "summary.csv").string();
  return path;
}

std::vector<std::string> ScenariosWithoutSpread(const std::string& path) {
  std::vector<std::string> names;
  const auto entries = ReadSummary(SummaryPath(path));
  for (const auto* entry : InFileOrder(entries)) {
    const auto& spread = entry->row.pp_tokens_per_s_spread;
    if (entry->row.status == Status::kPass && (!spread || std::isnan(*spread))) names.push_back(entry->row.scenario);
  }
  return names;
}

std::vector<std::string> ScenariosNotOk(const std::string& path) {
  std::vector<std::string> names;
  // The entries outlive the loop: InFileOrder points into them.
  const auto entries = ReadSummary(SummaryPath(path));
  for (const auto* entry : InFileOrder(entries)) {
    if (!entry->row.ok) names.push_back(entry->row.scenario);
  }
  return names;
}

namespace {

std::string ReadText(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw CompareError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream contents;
  contents << stream.rdbuf();
  return contents.str();
}

// Several runs' summaries as one: per scenario the fastest run's row, with the larger of the
// runs' spread between them and the median of their own timed steps' spreads (both robust: one
// run on a busy moment among three moves neither). The fastest, not the median: a shared runner's
// noise slows a run far more often than it speeds one, so the fastest of three is the steadiest
// figure of what the machine does; replayed over recorded runs it catches more slowdowns than the
// median with no more false alarms (docs/measurements.md, scripts/gating.py).
std::string MergedSummary(const std::vector<std::string>& summaries) {
  std::vector<std::map<std::string, SummaryEntry>> runs;
  for (const auto& path : summaries) runs.push_back(ReadSummary(path));
  CsvTable merged(SummaryColumns());
  for (const auto* first : InFileOrder(runs[0])) {
    const std::string& scenario = first->row.scenario;
    std::vector<const SummaryRow*> rows;  // the scenario's row in each run
    std::vector<double> rates, spreads;
    for (size_t run = 0; run < runs.size(); ++run) {
      const auto found = runs[run].find(scenario);
      if (found == runs[run].end()) {
        throw CompareError(fmt::format("{}: scenario '{}' is missing: runs merged into one baseline must be of the same "
                                       "suite", summaries[run], scenario));
      }
      rows.push_back(&found->second.row);
      const double rate = Measured(found->second.row.pp_tokens_per_s);
      if (!std::isnan(rate)) rates.push_back(rate);
      const double spread = Measured(found->second.row.pp_tokens_per_s_spread);
      if (!std::isnan(spread)) spreads.push_back(spread);
    }
    SummaryRow chosen = *rows[0];
    if (!rates.empty()) {
      // The fastest run's row stands for the scenario (a run without a rate never does).
      const auto fastest = std::max_element(rows.begin(), rows.end(), [](const SummaryRow* a, const SummaryRow* b) {
        const double x = Measured(a->pp_tokens_per_s), y = Measured(b->pp_tokens_per_s);
        return (std::isnan(x) && !std::isnan(y)) || x < y;  // NaN below every rate
      });
      chosen = **fastest;
      const double between = RobustSpread(rates);
      const double within = spreads.empty() ? std::nan("") : MedianOf(spreads);
      const double spread = std::fmax(between, within);  // the other where one is NaN
      chosen.pp_tokens_per_s_spread = std::isnan(spread) ? std::nullopt : std::optional<double>(spread);
      chosen.pp_tokens_per_s_runs = static_cast<int64_t>(rates.size());
    }
    merged.AddRow(Cells(SummaryFields(), chosen));
  }
  return merged.ToString();
}

}  // namespace

std::string RunnerBaseline(const std::string& directory, const std::string& runner) {
  const bool plain = !runner.empty() && runner[0] != '.' &&
                     std::all_of(runner.begin(), runner.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
                     });
  if (!plain) {
    throw CompareError(fmt::format("runner '{}': a runner name is a folder name of letters, digits, '.', '_' and '-', "
                                   "not starting with '.'", runner));
  }
  return (std::filesystem::path(directory) / runner).string();
}

std::vector<std::string> PromoteToBaseline(const std::vector<std::string>& run_paths,
                                           const std::string& baseline_directory, bool allow_not_ok) {
  if (run_paths.empty()) throw CompareError("no run to promote");
  std::vector<std::string> summaries;
  for (const auto& run_path : run_paths) {
    const std::string summary = SummaryPath(run_path);
    const auto not_ok = ScenariosNotOk(summary);  // also proves it is a readable pipecheck summary
    if (!not_ok.empty() && !allow_not_ok) {
      throw CompareError(fmt::format("{}: {} scenario(s) did not meet their expectation ({}); a baseline must be a "
                                     "good run (pass --allow-failures to promote it anyway)",
                                     summary, not_ok.size(), fmt::join(not_ok, ", ")));
    }
    summaries.push_back(summary);
  }
  const std::string summary_text = summaries.size() == 1 ? ReadText(summaries[0]) : MergedSummary(summaries);
  std::filesystem::create_directories(baseline_directory);
  const auto source = std::filesystem::path(summaries[0]).parent_path();
  std::vector<std::string> written;
  for (const char* name : {"summary.csv", "params.csv", "steps.csv", "ranks.csv"}) {
    const auto from = source / name;
    if (!std::filesystem::exists(from)) continue;
    const auto to = (std::filesystem::path(baseline_directory) / name).string();
    WriteFileAtomically(to, std::string(name) == "summary.csv" ? summary_text : ReadText(from.string()));
    written.push_back(to);
  }
  return written;
}

std::string LeftOutNote(const Comparison& comparison) {
  return fmt::format("{} baseline scenario(s) left out: not selected by --only '{}'", comparison.left_out,
                     comparison.only);
}

std::string FormatComparison(const Comparison& comparison, const CompareOptions& options) {
  size_t width = 8;
  for (const auto& row : comparison.rows) width = std::max(width, row.scenario.size());
  std::string text = fmt::format("{:<{}} {:<10} {:>8} {:>8} {:>10} {:>8} {:>10}  {}\n", "scenario", width, "verdict",
                                 "baseline", "current", "tokens/s", "limit", "memory", "notes");
  for (const auto& row : comparison.rows) {
    text += fmt::format("{:<{}} {:<10} {:>8} {:>8} {:>10} {:>8} {:>10}  {}\n", row.scenario, width, row.verdict,
                        row.baseline_status, row.current_status, row.throughput_change, row.throughput_limit,
                        row.memory_change, row.notes);
  }
  text += fmt::format("\n{} scenarios compared: {} regression(s){}, {} warning(s) (limits: tokens/s -{:.0f}% or {:g} x "
                      "the baseline's recorded spread, whichever is larger, at most -{:.0f}%; memory +{:.0f}%)\n",
                      comparison.rows.size(), comparison.regressions,
                      comparison.changed ? fmt::format(" ({} of them a changed configuration)", comparison.changed) : "",
                      comparison.warnings, 100 * options.max_slowdown, options.noise_factor,
                      100 * std::max(options.max_slowdown, kNoiseLimitCap), 100 * options.max_memory_growth);
  if (comparison.left_out > 0) text += LeftOutNote(comparison) + "\n";
  if (comparison.unfingerprinted > 0) {
    text += fmt::format("note: the baseline records no configuration for {} scenario(s), so a changed configuration "
                        "under the same name cannot be seen there; re-record it with `pipecheck baseline update`\n",
                        comparison.unfingerprinted);
  }
  return text;
}

std::string ComparisonCsv(const Comparison& comparison) {
  CsvTable table(ComparisonColumns());
  for (const auto& row : comparison.rows) table.AddRow(Cells(ComparisonFields(), row));
  return table.ToString();
}

const Fields<ComparisonRow>& ComparisonFields() {
  using R = ComparisonRow;
  static const Fields<ComparisonRow> fields = {
      field::Text("scenario", &R::scenario),
      field::Text("verdict", &R::verdict),
      field::Text("baseline_status", &R::baseline_status),
      field::Text("current_status", &R::current_status),
      field::OptionalReal("baseline_tokens_per_s", &R::baseline_tokens_per_s),
      field::OptionalReal("current_tokens_per_s", &R::current_tokens_per_s),
      field::Text("throughput_change", &R::throughput_change),
      field::Text("throughput_limit", &R::throughput_limit),
      field::OptionalInteger("baseline_peak_bytes", &R::baseline_peak_bytes),
      field::OptionalInteger("current_peak_bytes", &R::current_peak_bytes),
      field::Text("memory_change", &R::memory_change),
      field::OptionalReal("baseline_grad_rel_err", &R::baseline_grad_rel_err),
      field::OptionalReal("current_grad_rel_err", &R::current_grad_rel_err),
      field::Text("notes", &R::notes),
  };
  return fields;
}

const std::vector<std::string>& ComparisonColumns() { return ColumnsOf(ComparisonFields()); }

namespace {

// What one scenario's comparison found: regressions fail it, warnings only say.
struct Findings {
  std::vector<std::string> regressions, warnings;
  bool slower = false;  // one of the regressions is tokens/s
};

// The files the entries came from, for messages.
struct Sources {
  std::string baseline, current;
};

void JudgeStatus(const SummaryRow& base, const SummaryRow& now, Findings& found) {
  if (base.ok && !now.ok) {
    found.regressions.push_back(fmt::format("no longer meets expect={}: {} -> {}", now.expect, StatusName(base.status),
                                            StatusName(now.status)));
  } else if (base.expect == "pass" && Severity(now.status) > Severity(base.status)) {
    found.regressions.push_back(fmt::format("status worse: {} -> {}", StatusName(base.status), StatusName(now.status)));
  }
}

// A baseline spread past which even the capped limit is within the runner's noise: warned of.
// Idle, the default suite's 25 rows on a 2-core machine spread 1.3-21% (σ of single steps of
// 7-50 ms; their medians vary far less from run to run).
constexpr double kNoisyBaselineSpread = 0.25;

// Noise-aware: the limit widens to noise_factor x the spread the baseline recorded, up to the
// cap; without a recorded spread tokens/s is not gated at all.
void JudgeThroughput(const SummaryEntry& base, const SummaryEntry& now, const Sources& files,
                     const CompareOptions& options, ComparisonRow& row, Findings& found) {
  const double base_rate = MeasuredOfPass(base, base.row.pp_tokens_per_s, "pp_tokens_per_s", files.baseline);
  const double now_rate = MeasuredOfPass(now, now.row.pp_tokens_per_s, "pp_tokens_per_s", files.current);
  const double rate_change = base_rate > 0 ? now_rate / base_rate - 1.0 : std::nan("");
  row.throughput_change = Percent(rate_change);
  const double spread = Measured(base.row.pp_tokens_per_s_spread);
  const std::string runs = base.row.pp_tokens_per_s_runs ? std::to_string(*base.row.pp_tokens_per_s_runs) : "";
  const double noise_limit = std::isnan(spread) ? 0.0 : options.noise_factor * spread;
  const double cap = std::max(options.max_slowdown, kNoiseLimitCap);
  const double limit = std::min(cap, std::max(options.max_slowdown, noise_limit));
  const std::string over = fmt::format("{:g} x the baseline's {:.1f}% spread over {} {}", options.noise_factor,
                                       100 * spread, runs.empty() ? "1" : runs,
                                       runs.empty() || runs == "1" ? "run's timed steps" : "runs");
  const std::string why = noise_limit > cap                     ? fmt::format(": the cap; {} is -{:.0f}%", over, 100 * noise_limit)
                          : noise_limit > options.max_slowdown ? ": " + over
                                                               : "";
  row.throughput_limit = std::isnan(rate_change) ? "" : fmt::format("-{:.1f}%", 100 * limit);
  if (std::isnan(rate_change)) return;
  if (now.row.pp_timed_steps && *now.row.pp_timed_steps <= 1) {
    // One timed step is one sample of the runner's noise, not a measure of speed: the default
    // suite's generated rows time one (their figure is indicative), as does --timed-steps 0. No
    // warning either: on a 2-core runner a third of those rows drop 10% on an idle rerun.
    row.throughput_limit = "not gated";
  } else if (std::isnan(spread)) {
    // No measure of this runner's noise: one run whose timed steps were too few for a spread.
    // Gating on a guess fails unchanged reruns (9 of the core suite's 14 on a 2-core machine).
    row.throughput_limit = "not gated";
    if (rate_change < -options.max_slowdown) {
      found.warnings.push_back(fmt::format("tokens/s {}, not gated: the baseline recorded no spread (one run, too few "
                                           "timed steps); re-record it from three runs (baseline update --from R1 "
                                           "--from R2 --from R3)", Percent(rate_change)));
    }
  } else if (rate_change < -limit) {
    found.regressions.push_back(fmt::format("tokens/s {} (limit -{:.1f}%{})", Percent(rate_change), 100 * limit, why));
    found.slower = true;
  } else if (spread > kNoisyBaselineSpread && noise_limit > cap) {
    found.warnings.push_back(fmt::format("tokens/s limit capped at -{:.0f}% ({} would allow -{:.0f}%): this runner's "
                                         "noise may cross it; record the baseline again on a quieter runner",
                                         100 * cap, over, 100 * noise_limit));
  }
}

void JudgeMemory(const SummaryEntry& base, const SummaryEntry& now, const Sources& files, const CompareOptions& options,
                 ComparisonRow& row, Findings& found) {
  const double base_bytes = MeasuredOfPass(base, base.row.pp_peak_bytes_max, "pp_peak_bytes_max", files.baseline);
  const double now_bytes = MeasuredOfPass(now, now.row.pp_peak_bytes_max, "pp_peak_bytes_max", files.current);
  const double memory_change = base_bytes > 0 ? now_bytes / base_bytes - 1.0 : std::nan("");
  row.memory_change = Percent(memory_change);
  if (memory_change > options.max_memory_growth) {
    found.regressions.push_back(fmt::format("peak memory {} (limit +{:.0f}%)", Percent(memory_change),
                                            100 * options.max_memory_growth));
  }
}

void JudgeParityError(const SummaryRow& base, const SummaryRow& now, Findings& found) {
  const double base_error = Measured(base.grad_max_rel_err);
  const double now_error = Measured(now.grad_max_rel_err);
  if (now.status == Status::kPass && base_error > 0 && now_error > 10 * base_error) {
    found.warnings.push_back(fmt::format("gradient error grew {:.0f}x ({:.3g} -> {:.3g}), still passing",
                                         now_error / base_error, base_error, now_error));
  }
}

// The compared columns of either side, as summary.csv writes them.
void SetBaseline(ComparisonRow& row, const SummaryRow& base) {
  row.baseline_status = StatusName(base.status);
  row.baseline_tokens_per_s = base.pp_tokens_per_s;
  row.baseline_peak_bytes = base.pp_peak_bytes_max;
  row.baseline_grad_rel_err = base.grad_max_rel_err;
}

void SetCurrent(ComparisonRow& row, const SummaryRow& now) {
  row.current_status = StatusName(now.status);
  row.current_tokens_per_s = now.pp_tokens_per_s;
  row.current_peak_bytes = now.pp_peak_bytes_max;
  row.current_grad_rel_err = now.grad_max_rel_err;
}

// One baseline scenario against the current run's (none: it went missing). The verdict is
// CHANGED (another configuration: nothing else is comparable), REGRESSION, warning or ok.
ComparisonRow CompareRow(const SummaryEntry& base, const SummaryEntry* now, const Sources& files,
                         const CompareOptions& options) {
  ComparisonRow row;
  row.scenario = base.row.scenario;
  SetBaseline(row, base.row);
  Findings found;
  if (now == nullptr) {
    found.regressions.push_back("missing from the current run");
  } else {
    SetCurrent(row, now->row);
    if (!base.row.fingerprint.empty() && !now->row.fingerprint.empty() && base.row.fingerprint != now->row.fingerprint) {
      row.verdict = "CHANGED";
      row.notes = fmt::format("configuration changed ({}): not comparable; re-record the baseline or restore the "
                              "scenario", ConfigurationChanges(base.row.config, now->row.config));
      return row;
    }
    JudgeStatus(base.row, now->row, found);
    JudgeThroughput(base, *now, files, options, row, found);
    JudgeMemory(base, *now, files, options, row, found);
    JudgeParityError(base.row, now->row, found);
  }
  std::vector<std::string> notes = found.regressions;
  notes.insert(notes.end(), found.warnings.begin(), found.warnings.end());
  row.notes = fmt::format("{}", fmt::join(notes, "; "));
  row.verdict = !found.regressions.empty() ? "REGRESSION" : (!found.warnings.empty() ? "warning" : "ok");
  row.slower_only = found.slower && found.regressions.size() == 1;
  return row;
}

}  // namespace

namespace {

std::vector<std::string> Globs(const std::string& only) {
  std::vector<std::string> globs;
  std::stringstream stream(only);
  std::string glob;
  while (std::getline(stream, glob, ',')) {
    if (!glob.empty()) globs.push_back(glob);
  }
  return globs;
}

// The rows of `entries` that --only's globs select (all of them without globs); `used[i]` is set
// for each glob that selected one.
std::map<std::string, SummaryEntry> Selected(const std::map<std::string, SummaryEntry>& entries,
                                             const std::vector<std::string>& globs,
                                             const std::vector<std::string>& names, std::vector<bool>& used) {
  if (globs.empty() && names.empty()) return entries;
  std::map<std::string, SummaryEntry> selected;
  for (const auto& [name, entry] : entries) {
    if (std::find(names.begin(), names.end(), name) != names.end()) selected.emplace(name, entry);
    for (size_t i = 0; i < globs.size(); ++i) {
      if (fnmatch(globs[i].c_str(), name.c_str(), 0) == 0) {
        used[i] = true;
        selected.emplace(name, entry);
      }
    }
  }
  return selected;
}

Comparison Compare(const std::map<std::string, SummaryEntry>& all_baseline,
                   const std::map<std::string, SummaryEntry>& all_current, const Sources& files,
                   const CompareOptions& options) {
  Comparison comparison;
  const auto globs = Globs(options.only);
  std::vector<bool> used(globs.size(), false);
  const auto baseline = Selected(all_baseline, globs, options.ran, used);
  const auto current = Selected(all_current, globs, options.ran, used);
  for (size_t i = 0; i < globs.size(); ++i) {
    if (!used[i]) {
      throw CompareError(fmt::format("--only '{}': no scenario of {} or {} matches it", globs[i], files.baseline,
                                     files.current));
    }
  }
  comparison.only = options.only_as_given.empty() ? options.only : options.only_as_given;
  comparison.left_out = static_cast<int>(all_baseline.size() - baseline.size());
  // Rows in suite order: the baseline's, then scenarios new in the current run in its order.
  for (const auto* base : InFileOrder(baseline)) {
    const auto found = current.find(base->row.scenario);
    ComparisonRow row = CompareRow(*base, found == current.end() ? nullptr : &found->second, files, options);
    comparison.regressions += Fails(row);
    comparison.changed += row.verdict == "CHANGED";
    comparison.warnings += row.verdict == "warning";
    comparison.unfingerprinted += base->row.fingerprint.empty() && found != current.end();
    comparison.rows.push_back(std::move(row));
  }
  for (const auto* now : InFileOrder(current)) {
    if (baseline.count(now->row.scenario)) continue;
    ComparisonRow row;
    row.scenario = now->row.scenario;
    row.verdict = "new";
    SetCurrent(row, now->row);
    row.notes = "not in the baseline";
    comparison.rows.push_back(std::move(row));
  }
  return comparison;
}

}  // namespace

Comparison CompareSummaries(const std::string& baseline_path, const std::string& current_path,
                            const CompareOptions& options) {
  const Sources files{SummaryPath(baseline_path), SummaryPath(current_path)};
  return Compare(ReadSummary(files.baseline), ReadSummary(files.current), files, options);
}

Comparison CompareWithBaseline(const std::string& baseline_path, const std::vector<ScenarioReport>& current,
                               const std::string& current_name, const CompareOptions& options) {
  const Sources files{SummaryPath(baseline_path), current_name};
  std::vector<SummaryRow> rows;
  std::vector<unsigned> lines;
  for (const auto& report : current) {
    rows.push_back(report.summary);
    lines.push_back(static_cast<unsigned>(lines.size() + 2));  // the line summary.csv holds it on
  }
  return Compare(ReadSummary(files.baseline), EntriesOf(rows, lines, current_name), files, options);
}

}  // namespace pipecheck::reports
