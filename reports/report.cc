// Report rows and writers (see report.h).
#include "reports/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "reports/csv.h"

namespace pipecheck::reports {

const Fields<SummaryRow>& SummaryFields() {
  using R = SummaryRow;
  static const Fields<SummaryRow> fields = {
      field::Text("scenario", &R::scenario),
      field::StatusOf("status", &R::status),
      field::Text("expect", &R::expect),
      field::Flag("ok", &R::ok),
      field::Integer("world_size", &R::world_size),
      field::Text("schedule", &R::schedule),
      field::Integer("virtual_stages", &R::virtual_stages),
      field::Integer("microbatches", &R::microbatches),
      field::Text("dtype", &R::dtype),
      field::Text("device", &R::device),
      field::Integer("steps", &R::steps),
      field::OptionalInteger("tokens", &R::tokens),
      field::OptionalReal("loss_ref", &R::loss_ref),
      field::OptionalReal("loss_pp", &R::loss_pp),
      field::OptionalReal("loss_max_abs_diff", &R::loss_max_abs_diff),
      field::OptionalReal("grad_max_rel_err", &R::grad_max_rel_err),
      field::Text("worst_param", &R::worst_param),
      field::OptionalInteger("params_checked", &R::params_checked),
      field::OptionalReal("weights_max_rel_err", &R::weights_max_rel_err),
      field::OptionalReal("ref_step_ms", &R::ref_step_ms),
      field::OptionalReal("pp_step_ms", &R::pp_step_ms),
      field::OptionalReal("ref_tokens_per_s", &R::ref_tokens_per_s),
      field::OptionalReal("pp_tokens_per_s", &R::pp_tokens_per_s),
      field::OptionalInteger("ref_peak_bytes", &R::ref_peak_bytes),
      field::OptionalInteger("pp_peak_bytes_max", &R::pp_peak_bytes_max),
      field::OptionalReal("bubble_theory", &R::bubble_theory),
      field::OptionalReal("bubble_measured", &R::bubble_measured),
      field::Text("message", &R::message),
      field::Text("transport", &R::transport),
      field::OptionalInteger("pp_peak_bytes_predicted", &R::pp_peak_bytes_predicted),
      field::OptionalReal("pp_step_ms_predicted", &R::pp_step_ms_predicted),
      field::OptionalReal("wall_s", &R::wall_s),
      field::OptionalReal("pp_tokens_per_s_spread", &R::pp_tokens_per_s_spread),
      field::OptionalInteger("pp_tokens_per_s_runs", &R::pp_tokens_per_s_runs),
      field::Text("fingerprint", &R::fingerprint),
      field::Text("config", &R::config),
      field::Text("trainer", &R::trainer),
      field::Integer("data_parallel", &R::data_parallel),
      field::Flag("recompute", &R::recompute),
      field::Integer("accumulation", &R::accumulation),
      field::OptionalInteger("pp_timed_steps", &R::pp_timed_steps),
      field::OptionalReal("aux_loss_ref", &R::aux_loss_ref),
      field::OptionalReal("aux_loss_pp", &R::aux_loss_pp),
      field::OptionalReal("aux_loss_max_rel_err", &R::aux_loss_max_rel_err),
      field::OptionalInteger("routing_adopted", &R::routing_adopted),
  };
  return fields;
}

double MedianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

double RobustSpread(const std::vector<double>& values) {
  if (values.size() < 2) return std::nan("");
  const double median = MedianOf(values);
  std::vector<double> deviations;
  for (double value : values) deviations.push_back(std::abs(value - median));
  return median > 0 ? 1.4826 * MedianOf(std::move(deviations)) / median : std::nan("");
}

const std::vector<std::string>& SummaryColumns() { return ColumnsOf(SummaryFields()); }

const Fields<ParamRow>& ParamFields() {
  using R = ParamRow;
  static const Fields<ParamRow> fields = {
      field::Text("scenario", &R::scenario),     field::Text("param", &R::param),
      field::Integer("stage", &R::stage),        field::Integer("rank", &R::rank),
      field::Integer("numel", &R::numel),        field::Real("ref_norm", &R::ref_norm),
      field::Real("pp_norm", &R::pp_norm),       field::Real("max_abs_diff", &R::max_abs_diff),
      field::Real("rel_err", &R::rel_err),       field::Flag("ok", &R::ok),
      field::Integer("replica", &R::replica),
  };
  return fields;
}

const Fields<StepRow>& StepFields() {
  using R = StepRow;
  static const Fields<StepRow> fields = {
      field::Text("scenario", &R::scenario), field::Integer("step", &R::step), field::Real("loss_ref", &R::loss_ref),
      field::Real("loss_pp", &R::loss_pp),   field::Real("abs_diff", &R::abs_diff),
      field::Integer("layout", &R::layout),
  };
  return fields;
}

const Fields<TimelineRow>& TimelineFields() {
  using R = TimelineRow;
  static const Fields<TimelineRow> fields = {
      field::Text("scenario", &R::scenario),
      field::Integer("rank", &R::rank),
      field::Integer("step", &R::step),
      field::Text("action", &R::action),
      field::Integer("stage", &R::stage),
      field::Integer("microbatch", &R::microbatch),
      field::Real("start_us", &R::start_us),
      field::Real("end_us", &R::end_us),
      field::OptionalInteger("held_bytes", &R::held_bytes),
      field::OptionalInteger("held_bytes_predicted", &R::held_bytes_predicted),
      field::Real("wait_start_us", &R::wait_start_us),
      field::OptionalReal("step_start_us", &R::step_start_us),
      field::OptionalInteger("peak_bytes", &R::peak_bytes),
      field::OptionalInteger("peak_bytes_predicted", &R::peak_bytes_predicted),
      field::Integer("layout", &R::layout),
  };
  return fields;
}

const Fields<RankRow>& RankFields() {
  using R = RankRow;
  static const Fields<RankRow> fields = {
      field::Text("scenario", &R::scenario),
      field::Integer("rank", &R::rank),
      field::Text("stages", &R::stages),
      field::Integer("params", &R::params),
      field::OptionalInteger("peak_bytes", &R::peak_bytes),
      field::OptionalReal("busy_ms", &R::busy_ms),
      field::OptionalReal("idle_ms", &R::idle_ms),
      field::OptionalReal("comm_ms", &R::comm_ms),
      field::OptionalInteger("peak_bytes_predicted", &R::peak_bytes_predicted),
      field::OptionalReal("step_ms", &R::step_ms),
      field::OptionalReal("step_ms_predicted", &R::step_ms_predicted),
      field::Integer("replica", &R::replica),
      field::OptionalReal("forward_ms", &R::forward_ms),
      field::OptionalReal("backward_ms", &R::backward_ms),
      field::OptionalReal("input_grad_ms", &R::input_grad_ms),
      field::OptionalReal("weight_grad_ms", &R::weight_grad_ms),
      field::OptionalReal("other_ms", &R::other_ms),
  };
  return fields;
}

const std::vector<std::string>& ParamColumns() { return ColumnsOf(ParamFields()); }

const std::vector<std::string>& StepColumns() { return ColumnsOf(StepFields()); }

const std::vector<std::string>& TimelineColumns() { return ColumnsOf(TimelineFields()); }

const std::vector<std::string>& RankColumns() { return ColumnsOf(RankFields()); }

const Fields<BoundaryRow>& BoundaryFields() {
  using R = BoundaryRow;
  static const Fields<BoundaryRow> fields = {
      field::Text("scenario", &R::scenario),
      field::Integer("step", &R::step),
      field::Integer("microbatch", &R::microbatch),
      field::Integer("stage", &R::stage),
      field::Text("direction", &R::direction),
      field::Text("role", &R::role),
      field::Integer("rank", &R::rank),
      field::OptionalInteger("peer", &R::peer),
      field::Integer("numel", &R::numel),
      field::Real("ref_norm", &R::ref_norm),
      field::Real("pp_norm", &R::pp_norm),
      field::Real("ref_sum", &R::ref_sum),
      field::Real("pp_sum", &R::pp_sum),
      field::Real("ref_max_abs", &R::ref_max_abs),
      field::Real("pp_max_abs", &R::pp_max_abs),
      field::Real("rel_err", &R::rel_err),
      field::OptionalFlag("bitwise_equal", &R::bitwise_equal),
      field::Flag("ok", &R::ok),
  };
  return fields;
}

const Fields<CommRow>& CommFields() {
  using R = CommRow;
  static const Fields<CommRow> fields = {
      field::Text("scenario", &R::scenario),
      field::Integer("rank", &R::rank),
      field::Integer("step", &R::step),
      field::Integer("order", &R::order),
      field::Text("op", &R::op),
      field::OptionalInteger("peer", &R::peer),
      field::Text("direction", &R::direction),
      field::Integer("stage", &R::stage),
      field::Integer("microbatch", &R::microbatch),
      field::Text("dtype", &R::dtype),
      field::Text("shape", &R::shape),
      field::OptionalInteger("bytes", &R::bytes),
      field::Text("planned", &R::planned),
      field::Flag("ok", &R::ok),
      field::Integer("replica", &R::replica),
  };
  return fields;
}

const std::vector<std::string>& BoundaryColumns() { return ColumnsOf(BoundaryFields()); }

const std::vector<std::string>& CommColumns() { return ColumnsOf(CommFields()); }

std::string ScenarioReport::Get(const std::string& column) const { return CellOf(SummaryFields(), summary, column); }

std::string FormatNumber(double value) {
  if (std::isnan(value)) return "nan";
  return fmt::format("{}", value);
}

const char* StatusName(Status status) {
  switch (status) {
    case Status::kPass: return "PASS";
    case Status::kFail: return "FAIL";
    case Status::kError: return "ERROR";
    case Status::kTimeout: return "TIMEOUT";
    case Status::kSkipped: return "SKIPPED";
  }
  return "ERROR";
}

Status ParseStatus(const std::string& text) {
  for (Status status : {Status::kPass, Status::kFail, Status::kError, Status::kTimeout, Status::kSkipped}) {
    if (text == StatusName(status)) return status;
  }
  throw FieldError(fmt::format("column 'status', value '{}': expected PASS, FAIL, ERROR, TIMEOUT or SKIPPED", text));
}

namespace cell {

int64_t ParseInteger(const std::string& column, const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw FieldError(fmt::format("column '{}', value '{}': expected a whole number", column, text));
  }
  return value;
}

double ParseReal(const std::string& column, const std::string& text) {
  if (text == "nan") return std::nan("");
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw FieldError(fmt::format("column '{}', value '{}': expected a number", column, text));
  }
  return value;
}

bool ParseFlag(const std::string& column, const std::string& text) {
  if (text == "1") return true;
  if (text == "0") return false;
  throw FieldError(fmt::format("column '{}', value '{}': expected 1 or 0", column, text));
}

}  // namespace cell

namespace {

// Rows as lists of cells in their file's columns (the JSON a rank hands the launcher), and back.
template <typename Row>
std::vector<std::vector<std::string>> RowsOf(const Fields<Row>& fields, const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> cells;
  for (const auto& row : rows) cells.push_back(Cells(fields, row));
  return cells;
}

template <typename Row>
std::vector<Row> TypedRows(const Fields<Row>& fields, const std::vector<std::vector<std::string>>& cells) {
  std::vector<Row> rows;
  for (const auto& row : cells) rows.push_back(ParseInOrder(fields, row));
  return rows;
}

}  // namespace

std::string ToJson(const ScenarioReport& report) {
  nlohmann::json json;
  std::map<std::string, std::string> summary;
  const auto& fields = SummaryFields();
  for (const auto& f : fields) summary[f.name] = f.format(report.summary);
  json["summary"] = summary;
  json["params"] = RowsOf(ParamFields(), report.params);
  json["steps"] = RowsOf(StepFields(), report.steps);
  json["timeline"] = RowsOf(TimelineFields(), report.timeline);
  json["ranks"] = RowsOf(RankFields(), report.ranks);
  json["boundaries"] = RowsOf(BoundaryFields(), report.boundaries);
  json["comm"] = RowsOf(CommFields(), report.comm);
  return json.dump();
}

ScenarioReport FromJson(const std::string& text) {
  const auto json = nlohmann::json::parse(text);
  ScenarioReport report;
  std::vector<std::string> header, cells;
  for (const auto& [name, value] : json.at("summary").get<std::map<std::string, std::string>>()) {
    header.push_back(name);
    cells.push_back(value);
  }
  report.summary = ParseCells(SummaryFields(), header, cells);
  report.params = TypedRows(ParamFields(), json.at("params").get<std::vector<std::vector<std::string>>>());
  report.steps = TypedRows(StepFields(), json.at("steps").get<std::vector<std::vector<std::string>>>());
  report.timeline = TypedRows(TimelineFields(), json.at("timeline").get<std::vector<std::vector<std::string>>>());
  report.ranks = TypedRows(RankFields(), json.at("ranks").get<std::vector<std::vector<std::string>>>());
  report.boundaries = TypedRows(BoundaryFields(), json.value("boundaries", std::vector<std::vector<std::string>>{}));
  report.comm = TypedRows(CommFields(), json.value("comm", std::vector<std::vector<std::string>>{}));
  return report;
}

std::vector<std::string> WriteReports(const std::string& directory, const std::vector<ScenarioReport>& reports) {
  std::filesystem::create_directories(directory);
  CsvTable summary(SummaryColumns()), params(ParamColumns()), steps(StepColumns()), ranks(RankColumns()),
      timeline(TimelineColumns()), boundaries(BoundaryColumns()), comm(CommColumns());
  for (const auto& report : reports) {
    summary.AddRow(Cells(SummaryFields(), report.summary));
    for (const auto& param : report.params) params.AddRow(Cells(ParamFields(), param));
    for (const auto& step : report.steps) steps.AddRow(Cells(StepFields(), step));
    for (const auto& rank : report.ranks) ranks.AddRow(Cells(RankFields(), rank));
    for (const auto& event : report.timeline) timeline.AddRow(Cells(TimelineFields(), event));
    for (const auto& row : report.boundaries) boundaries.AddRow(Cells(BoundaryFields(), row));
    for (const auto& row : report.comm) comm.AddRow(Cells(CommFields(), row));
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
