// Report rows and writers (see report.h).
#include "reports/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "reports/csv.h"

namespace pipecheck::reports {

const std::vector<std::string>& SummaryColumns() {
  static const std::vector<std::string> columns = {
      "scenario",        "status",          "expect",           "ok",                 "world_size",
      "schedule",        "virtual_stages",  "microbatches",     "dtype",              "device",
      "steps",           "tokens",          "loss_ref",         "loss_pp",            "loss_max_abs_diff",
      "grad_max_rel_err", "worst_param",    "params_checked",   "weights_max_rel_err", "ref_step_ms",
      "pp_step_ms",      "ref_tokens_per_s", "pp_tokens_per_s", "ref_peak_bytes",     "pp_peak_bytes_max",
      "bubble_theory",   "bubble_measured", "message",          "transport",          "pp_peak_bytes_predicted",
      "pp_step_ms_predicted", "wall_s",        "pp_tokens_per_s_spread", "pp_tokens_per_s_runs", "fingerprint",
      "config"};
  return columns;
}

const std::vector<std::string>& ParamColumns() {
  static const std::vector<std::string> columns = {"scenario", "param", "stage", "rank", "numel", "ref_norm",
                                                   "pp_norm", "max_abs_diff", "rel_err", "ok"};
  return columns;
}

const std::vector<std::string>& StepColumns() {
  static const std::vector<std::string> columns = {"scenario", "step", "loss_ref", "loss_pp", "abs_diff"};
  return columns;
}

const std::vector<std::string>& TimelineColumns() {
  static const std::vector<std::string> columns = {"scenario", "rank",         "step",     "action",
                                                   "stage",    "microbatch",   "start_us", "end_us",
                                                   "held_bytes", "held_bytes_predicted", "wait_start_us",
                                                   "step_start_us", "peak_bytes", "peak_bytes_predicted"};
  return columns;
}

const std::vector<std::string>& RankColumns() {
  static const std::vector<std::string> columns = {"scenario",   "rank",    "stages",  "params",
                                                   "peak_bytes", "busy_ms", "idle_ms", "comm_ms",
                                                   "peak_bytes_predicted", "step_ms", "step_ms_predicted"};
  return columns;
}

const std::vector<std::string>& BoundaryColumns() {
  static const std::vector<std::string> columns = {
      "scenario", "step",    "microbatch", "stage",   "direction", "role",        "rank",          "peer",      "numel",
      "ref_norm", "pp_norm", "ref_sum",    "pp_sum",  "ref_max_abs", "pp_max_abs", "rel_err", "bitwise_equal", "ok"};
  return columns;
}

const std::vector<std::string>& CommColumns() {
  static const std::vector<std::string> columns = {"scenario", "rank",  "step",       "order", "op",      "peer",
                                                   "direction", "stage", "microbatch", "dtype", "shape",   "bytes",
                                                   "planned",   "ok"};
  return columns;
}

const std::string& ScenarioReport::Get(const std::string& column) const {
  static const std::string empty;
  auto found = summary.find(column);
  return found == summary.end() ? empty : found->second;
}

std::string FormatNumber(double value) {
  if (std::isnan(value)) return "nan";
  return fmt::format("{}", value);
}

std::string ToJson(const ScenarioReport& report) {
  nlohmann::json json;
  json["summary"] = report.summary;
  json["params"] = report.params;
  json["steps"] = report.steps;
  json["timeline"] = report.timeline;
  json["ranks"] = report.ranks;
  json["boundaries"] = report.boundaries;
  json["comm"] = report.comm;
  return json.dump();
}

ScenarioReport FromJson(const std::string& text) {
  const auto json = nlohmann::json::parse(text);
  ScenarioReport report;
  report.summary = json.at("summary").get<std::map<std::string, std::string>>();
  report.params = json.at("params").get<std::vector<std::vector<std::string>>>();
  report.steps = json.at("steps").get<std::vector<std::vector<std::string>>>();
  report.timeline = json.at("timeline").get<std::vector<std::vector<std::string>>>();
  report.ranks = json.at("ranks").get<std::vector<std::vector<std::string>>>();
  report.boundaries = json.value("boundaries", std::vector<std::vector<std::string>>{});
  report.comm = json.value("comm", std::vector<std::vector<std::string>>{});
  return report;
}

std::vector<std::string> WriteReports(const std::string& directory, const std::vector<ScenarioReport>& reports) {
  std::filesystem::create_directories(directory);
  CsvTable summary(SummaryColumns()), params(ParamColumns()), steps(StepColumns()), ranks(RankColumns()),
      timeline(TimelineColumns()), boundaries(BoundaryColumns()), comm(CommColumns());
  for (const auto& report : reports) {
    std::vector<std::string> row;
    for (const auto& column : SummaryColumns()) row.push_back(report.Get(column));
    summary.AddRow(row);
    for (const auto& param : report.params) params.AddRow(param);
    for (const auto& step : report.steps) steps.AddRow(step);
    for (const auto& rank : report.ranks) ranks.AddRow(rank);
    for (const auto& event : report.timeline) timeline.AddRow(event);
    for (const auto& row : report.boundaries) boundaries.AddRow(row);
    for (const auto& row : report.comm) comm.AddRow(row);
  }
  const std::filesystem::path out(directory);
  std::vector<std::string> paths = {(out / "summary.csv").string(), (out / "params.csv").string(),
                                    (out / "steps.csv").string(), (out / "ranks.csv").string(),
                                    (out / "timeline.csv").string(), (out / "boundaries.csv").string(),
                                    (out / "comm.csv").string()};
  WriteFileAtomically(paths[0], summary.ToString());
  WriteFileAtomically(paths[1], params.ToString());
  WriteFileAtomically(paths[2], steps.ToString());
  WriteFileAtomically(paths[3], ranks.ToString());
  WriteFileAtomically(paths[4], timeline.ToString());
  WriteFileAtomically(paths[5], boundaries.ToString());
  WriteFileAtomically(paths[6], comm.ToString());
  return paths;
}

}  // namespace pipecheck::reports
