// A scenario's stretches between resumes (see resume.h).
#include "harness/resume.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "harness/parity.h"
#include "reports/verdict.h"

namespace pipecheck::harness {
namespace {

namespace fs = std::filesystem;

std::string CheckpointFolder(const std::string& folder, int64_t step) {
  return (fs::path(folder) / fmt::format("checkpoint_after_step{}", step)).string();
}

std::string JudgeStatePath(const std::string& folder, int64_t step) {
  return (fs::path(folder) / fmt::format("judge_after_step{}.pt", step)).string();
}

// How bad a status is, for the row's worst.
int Severity(reports::Status status) {
  switch (status) {
    case reports::Status::kPass: return 0;
    case reports::Status::kFail: return 1;
    case reports::Status::kTimeout: return 2;
    case reports::Status::kError: return 3;
    case reports::Status::kSkipped: return 4;
  }
  return 3;
}

template <typename T>
void KeepLarger(std::optional<T>& into, const std::optional<T>& value) {
  if (!value) return;
  if (!into || *value > *into || std::isnan(static_cast<double>(*value))) into = value;
}

// "after step 2 (world_size=4)", one per resume.
std::string Resumes(const scenarios::Scenario& scenario) {
  std::vector<std::string> parts;
  for (const auto& resume : scenario.resumes) {
    std::vector<std::string> settings;
    for (const auto& [column, value] : resume.settings) settings.push_back(column + "=" + value);
    parts.push_back(fmt::format("after step {} ({})", resume.step,
                                settings.empty() ? std::string("same layout") : fmt::format("{}", fmt::join(settings, ";"))));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

std::vector<Stretch> StretchesOf(const scenarios::Scenario& scenario, const std::string& folder) {
  std::vector<Stretch> stretches;
  const int count = static_cast<int>(scenario.resumes.size()) + 1;
  for (int i = 0; i < count; ++i) {
    Stretch stretch;
    // The row, with the layout columns of the layout after resume i - 1: whatever else the row
    // says now (its fault, its expectation) holds for every stretch.
    stretch.scenario = scenario;
    if (i > 0) {
      const auto& layout = scenario.layouts[static_cast<size_t>(i - 1)];
      auto& s = stretch.scenario;
      s.world_size = layout.world_size;
      s.schedule = layout.schedule;
      s.schedule_written = layout.schedule_written;
      s.virtual_stages = layout.virtual_stages;
      s.partition = layout.partition;
      s.data_parallel = layout.data_parallel;
      s.recompute = layout.recompute;
      s.accumulation = layout.accumulation;
    }
    stretch.scenario.resume.clear();
    stretch.scenario.resumes.clear();
    stretch.scenario.layouts.clear();
    const int64_t first = i == 0 ? 0 : scenario.resumes[static_cast<size_t>(i - 1)].step;
    const int64_t end = i + 1 < count ? scenario.resumes[static_cast<size_t>(i)].step : scenario.steps;
    stretch.scenario.steps = end;
    auto& segment = stretch.segment;
    segment.index = i;
    segment.count = count;
    segment.first_step = first;
    if (i > 0) {
      segment.load_checkpoint = CheckpointFolder(folder, first);
      segment.judge_state_in = JudgeStatePath(folder, first);
    }
    if (i + 1 < count) {
      segment.save_checkpoint = CheckpointFolder(folder, end);
      segment.judge_state_out = JudgeStatePath(folder, end);
    }
    stretches.push_back(std::move(stretch));
  }
  return stretches;
}

reports::ScenarioReport MergeStretches(const scenarios::Scenario& scenario, const std::vector<Stretch>& stretches,
                                       const std::vector<reports::ScenarioReport>& reports) {
  reports::Status status = reports::Status::kPass;
  const reports::ScenarioReport* blamed = nullptr;  // the first stretch that did not pass
  size_t blamed_index = 0;
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto s = reports[i].summary.status;
    if (Severity(s) > Severity(status)) status = s;
    if (s != reports::Status::kPass && blamed == nullptr) blamed = &reports[i], blamed_index = i;
  }
  const bool cut_short = reports.size() < stretches.size();
  std::string message = "resumed " + Resumes(scenario) + ": ";
  if (blamed != nullptr) {
    const auto& segment = stretches[blamed_index].segment;
    message += fmt::format("layout {} (steps {} to {}): {}", blamed_index, segment.first_step,
                           stretches[blamed_index].scenario.steps - 1, blamed->summary.message);
  } else if (!reports.empty()) {
    message += "every layout's steps and loads matched; last layout: " + reports.back().summary.message;
  }
  if (cut_short) message += fmt::format("; the layouts after layout {} did not run", reports.size() - 1);
  const auto transport = reports.empty() ? std::optional<std::string>() : reports.back().summary.transport;
  auto merged = FailedScenarioReport(scenario, status, message, transport);
  auto& row = merged.summary;
  row.ok = reports::MeetsExpectation(status, scenario.expect);
  if (reports.empty()) return merged;
  const auto& last = reports.back().summary;
  row.tokens = last.tokens;
  row.loss_ref = last.loss_ref;
  row.loss_pp = last.loss_pp;
  row.params_checked = last.params_checked;
  row.ref_step_ms = last.ref_step_ms;
  row.pp_step_ms = last.pp_step_ms;
  row.ref_tokens_per_s = last.ref_tokens_per_s;
  row.pp_tokens_per_s = last.pp_tokens_per_s;
  row.pp_tokens_per_s_spread = last.pp_tokens_per_s_spread;
  row.pp_tokens_per_s_runs = last.pp_tokens_per_s_runs;
  row.pp_timed_steps = last.pp_timed_steps;
  row.bubble_theory = last.bubble_theory;
  row.bubble_measured = last.bubble_measured;
  row.pp_step_ms_predicted = last.pp_step_ms_predicted;
  row.aux_loss_ref = last.aux_loss_ref;
  row.aux_loss_pp = last.aux_loss_pp;
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& part = reports[i].summary;
    KeepLarger(row.loss_max_abs_diff, part.loss_max_abs_diff);
    if (part.grad_max_rel_err && (!row.grad_max_rel_err || !(*part.grad_max_rel_err <= *row.grad_max_rel_err))) {
      row.grad_max_rel_err = part.grad_max_rel_err;
      row.worst_param = part.worst_param;
    }
    KeepLarger(row.weights_max_rel_err, part.weights_max_rel_err);
    KeepLarger(row.ref_peak_bytes, part.ref_peak_bytes);
    KeepLarger(row.pp_peak_bytes_max, part.pp_peak_bytes_max);
    KeepLarger(row.pp_peak_bytes_predicted, part.pp_peak_bytes_predicted);
    KeepLarger(row.aux_loss_max_rel_err, part.aux_loss_max_rel_err);
    if (part.routing_adopted) row.routing_adopted = row.routing_adopted.value_or(0) + *part.routing_adopted;
    const auto layout = static_cast<int64_t>(i);
    for (auto step : reports[i].steps) {
      step.layout = layout;
      merged.steps.push_back(step);
    }
    // Each layout's clock starts at its own ranks' start: its actions follow the previous
    // layout's on the row's timeline.
    double end_us = 0.0, offset_us = 0.0;
    for (const auto& action : merged.timeline) end_us = std::max(end_us, action.step_start_us.value_or(0.0) + action.end_us);
    if (!merged.timeline.empty()) offset_us = end_us;
    for (auto action : reports[i].timeline) {
      action.layout = layout;
      if (action.step_start_us) *action.step_start_us += offset_us;
      merged.timeline.push_back(action);
    }
    merged.params.insert(merged.params.end(), reports[i].params.begin(), reports[i].params.end());
    merged.boundaries.insert(merged.boundaries.end(), reports[i].boundaries.begin(), reports[i].boundaries.end());
    merged.comm.insert(merged.comm.end(), reports[i].comm.begin(), reports[i].comm.end());
  }
  merged.ranks = reports.back().ranks;
  return merged;
}

}  // namespace pipecheck::harness
