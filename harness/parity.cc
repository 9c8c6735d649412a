// Pipeline-versus-reference comparison (see parity.h).
#include "harness/parity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace pipecheck::harness {
namespace {

using reports::FormatNumber;

double Norm(const torch::Tensor& tensor) { return tensor.to(torch::kFloat64).norm().item<double>(); }

double GlobalNorm(const reference::NamedTensors& tensors) {
  double squares = 0.0;
  for (const auto& item : tensors) squares += item.value().to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(squares);
}

struct TensorError {
  double rel = 0.0;
  double max_abs = 0.0;
  double ref_norm = 0.0;
  double pp_norm = 0.0;
};

TensorError Compare(const torch::Tensor& pipeline, const torch::Tensor& reference, double floor) {
  auto difference = pipeline.to(torch::kFloat64) - reference.to(torch::kFloat64);
  TensorError error;
  error.ref_norm = Norm(reference);
  error.pp_norm = Norm(pipeline);
  error.max_abs = difference.numel() ? difference.abs().max().item<double>() : 0.0;
  error.rel = Norm(difference) / std::max(error.ref_norm, floor);
  return error;
}



std::map<std::string, std::string> ScenarioColumns(const scenarios::Scenario& s) {
  return {{"scenario", s.name},
          {"expect", s.expect},
          {"world_size", std::to_string(s.world_size)},
          {"schedule", s.schedule},
          {"virtual_stages", std::to_string(s.virtual_stages)},
          {"microbatches", std::to_string(s.microbatches)},
          {"dtype", s.dtype},
          {"device", s.device},
          {"steps", std::to_string(s.steps)}};
}

// One rank's time over the timed steps, from its executor timeline: compute, communication
// calls (posting receives, starting sends), and the rest of each step's wall time (waiting).
struct RankTime {
  double busy_us = 0.0, comm_us = 0.0, wall_us = 0.0;
  int steps = 0;
};

RankTime TimeOf(const pipeline::RankResult& rank, size_t steps) {
  RankTime time;
  std::map<int64_t, double> step_end;
  for (const auto& t : rank.timeline) {
    if (t.step < static_cast<int64_t>(reference::FirstTimedStep(steps))) continue;
    step_end[t.step] = std::max(step_end[t.step], t.end_us);
    (t.action.IsCompute() ? time.busy_us : time.comm_us) += t.end_us - t.start_us;
  }
  for (const auto& [step, end] : step_end) time.wall_us += end;
  time.steps = static_cast<int>(step_end.size());
  return time;
}

}  // namespace

bool MeetsExpectation(const std::string& status, const std::string& expect) {
  return expect == "pass" ? status == "PASS" : status != "PASS";
}

reports::ScenarioReport FailedScenarioReport(const scenarios::Scenario& scenario, const std::string& status,
                                             const std::string& message) {
  reports::ScenarioReport report;
  report.summary = ScenarioColumns(scenario);
  report.summary["status"] = status;
  report.summary["ok"] = MeetsExpectation(status, scenario.expect) ? "1" : "0";
  report.summary["message"] = message;
  return report;
}

reports::ScenarioReport CompareWithReference(const ParityInput& input) {
  const auto& scenario = input.scenario;
  const auto& reference = input.reference;
  const double tol = scenario.tol;
  const size_t steps = reference.steps.size();
  reports::ScenarioReport report;
  report.summary = ScenarioColumns(scenario);
  // (step, kind) -> problems; kind 0 loss, 1 gradients, 2 final weights. The first entry is the
  // earliest evidence: a step's wrong gradients come before the next step's wrong loss.
  std::map<std::pair<size_t, int>, std::vector<std::string>> problems;

  // The rank holding the last stage knows the losses.
  const pipeline::RankResult* loss_rank = &input.ranks.back();
  for (const auto& rank : input.ranks) {
    if (!rank.losses.empty() && !std::isnan(rank.losses[0])) loss_rank = &rank;
  }

  // Losses, every step.
  double loss_max_abs_diff = 0.0;
  for (size_t k = 0; k < steps; ++k) {
    const double loss_ref = reference.steps[k].loss;
    const double loss_pp = k < loss_rank->losses.size() ? loss_rank->losses[k] : std::nan("");
    const double diff = std::abs(loss_pp - loss_ref);
    loss_max_abs_diff = std::isnan(diff) ? diff : std::max(loss_max_abs_diff, diff);
    report.steps.push_back({scenario.name, std::to_string(k), FormatNumber(loss_ref), FormatNumber(loss_pp),
                            FormatNumber(diff)});
    if (!(diff <= tol * std::max(1.0, std::abs(loss_ref)))) {
      problems[{k, 0}].push_back(fmt::format("loss at step {}: pipeline {:.12g} vs reference {:.12g} (diff {:.3g} > tol {:.3g})",
                                     k, loss_pp, loss_ref, diff, tol));
    }
  }

  // Gradients, every step, every parameter of every rank; params.csv keeps each parameter's
  // worst step.
  struct Worst {
    TensorError error;
    size_t step = 0;
    int stage = 0;
    int64_t numel = 0;
  };
  std::map<std::pair<std::string, int>, Worst> worst_by_param;  // (name, rank)
  std::map<std::string, bool> numerically_zero;  // reference gradient under the floor at every step
  double grad_max_rel = 0.0;
  std::string worst_param;
  size_t worst_step = 0;
  for (size_t k = 0; k < steps; ++k) {
    const auto& ref_gradients = reference.steps[k].gradients;
    const double floor = FloorFraction(tol) * GlobalNorm(ref_gradients);
    for (const auto& item : ref_gradients) {
      const bool zero_now = Norm(item.value()) <= floor;
      auto [entry, inserted] = numerically_zero.emplace(item.key(), zero_now);
      if (!inserted) entry->second = entry->second && zero_now;
    }
    std::map<std::string, int> seen;
    for (const auto& rank : input.ranks) {
      if (k >= rank.gradients.size()) {
        problems[{k, 1}].push_back(fmt::format("rank {} reported no gradients for step {}", rank.rank, k));
        continue;
      }
      for (const auto& item : rank.gradients[k]) {
        const std::string& name = item.key();
        ++seen[name];
        if (!ref_gradients.contains(name)) {
          problems[{k, 1}].push_back(
              fmt::format("rank {} has a gradient for {}, which the reference does not", rank.rank, name));
          continue;
        }
        const auto& ref = ref_gradients[name];
        const auto error = Compare(item.value(), ref, floor);
        auto& worst = worst_by_param[{name, rank.rank}];
        if (error.rel >= worst.error.rel) worst = {error, k, 0, ref.numel()};
        if (error.rel > grad_max_rel || worst_param.empty()) grad_max_rel = error.rel, worst_param = name, worst_step = k;
        if (error.pp_norm == 0.0 && error.ref_norm > floor) {
          problems[{k, 1}].push_back(fmt::format("gradient of {} at step {} is all zero on rank {}; the reference's norm is {:.3g}",
                                         name, k, rank.rank, error.ref_norm));
        } else if (!(error.rel <= tol)) {
          problems[{k, 1}].push_back(fmt::format("gradient of {} at step {} on rank {}: rel err {:.3g} > tol {:.3g}", name, k,
                                         rank.rank, error.rel, tol));
        }
      }
    }
    for (const auto& item : ref_gradients) {
      if (!seen.count(item.key())) {
        problems[{k, 1}].push_back(fmt::format("gradient of {} at step {} is missing from every rank", item.key(), k));
      }
    }
  }

  // Final weights.
  double weights_max_rel = 0.0;
  const double weight_floor = FloorFraction(tol) * GlobalNorm(reference.final_weights);
  for (const auto& rank : input.ranks) {
    for (const auto& item : rank.final_weights) {
      if (!reference.final_weights.contains(item.key()) || numerically_zero[item.key()]) continue;
      const auto error = Compare(item.value(), reference.final_weights[item.key()], weight_floor);
      weights_max_rel = std::max(weights_max_rel, error.rel);
      if (!(error.rel <= tol)) {
        problems[{steps, 2}].push_back(fmt::format("final weight {} on rank {}: rel err {:.3g} > tol {:.3g}", item.key(), rank.rank,
                                       error.rel, tol));
      }
    }
  }

  // params.csv: one row per parameter copy (a tied weight has two: first and last stage).
  for (const auto& rank : input.ranks) {
    for (const auto& item : rank.final_weights) {
      auto found = worst_by_param.find({item.key(), rank.rank});
      if (found == worst_by_param.end()) continue;
      const auto& w = found->second;
      const int stage = rank.stages.empty() ? 0 : rank.stages.front();
      report.params.push_back({scenario.name, item.key(), std::to_string(stage), std::to_string(rank.rank),
                               std::to_string(w.numel), FormatNumber(w.error.ref_norm), FormatNumber(w.error.pp_norm),
                               FormatNumber(w.error.max_abs), FormatNumber(w.error.rel),
                               w.error.rel <= tol ? "1" : "0"});
    }
  }

  // Speed: median step after warm-up; a pipeline step lasts as long as its slowest rank.
  std::vector<double> pp_ms, pp_rate;
  for (size_t k = reference::FirstTimedStep(steps); k < steps; ++k) {
    double slowest = 0.0;
    for (const auto& rank : input.ranks) slowest = std::max(slowest, k < rank.step_ms.size() ? rank.step_ms[k] : 0.0);
    pp_ms.push_back(slowest);
    pp_rate.push_back(static_cast<double>(reference.steps[k].tokens) / (slowest / 1000.0));
  }
  int64_t tokens = 0;
  for (const auto& step : reference.steps) tokens += step.tokens;
  for (const auto& rank : input.ranks) {
    for (const auto& t : rank.timeline) {
      const std::string action = t.action.ToString();
      report.timeline.push_back({scenario.name, std::to_string(rank.rank), std::to_string(t.step),
                                 action.substr(std::to_string(t.action.stage).size(),
                                               action.size() - std::to_string(t.action.stage).size() -
                                                   std::to_string(t.action.microbatch).size()),
                                 std::to_string(t.action.stage), std::to_string(t.action.microbatch),
                                 FormatNumber(std::round(t.start_us)), FormatNumber(std::round(t.end_us))});
    }
  }

  std::vector<std::string> failures;
  for (const auto& [when, found] : problems) failures.insert(failures.end(), found.begin(), found.end());
  const std::string status = failures.empty() ? "PASS" : "FAIL";
  auto& row = report.summary;
  row["status"] = status;
  row["ok"] = MeetsExpectation(status, scenario.expect) ? "1" : "0";
  row["tokens"] = std::to_string(tokens);
  row["loss_ref"] = FormatNumber(reference.steps.back().loss);
  row["loss_pp"] = FormatNumber(loss_rank->losses.empty() ? std::nan("") : loss_rank->losses.back());
  row["loss_max_abs_diff"] = FormatNumber(loss_max_abs_diff);
  row["grad_max_rel_err"] = FormatNumber(grad_max_rel);
  row["worst_param"] = worst_param;
  row["params_checked"] = std::to_string(reference.final_weights.size());
  std::vector<std::string> zero_names;
  for (const auto& [name, zero] : numerically_zero) {
    if (zero) zero_names.push_back(name);
  }
  row["weights_max_rel_err"] = FormatNumber(weights_max_rel);
  row["ref_step_ms"] = FormatNumber(reference.MedianStepMs());
  row["pp_step_ms"] = FormatNumber(reference::Median(pp_ms));
  row["ref_tokens_per_s"] = FormatNumber(reference.MedianTokensPerSecond());
  row["pp_tokens_per_s"] = FormatNumber(reference::Median(pp_rate));
  row["bubble_theory"] = FormatNumber(input.simulation.bubble);
  double busy = 0.0, wall = 0.0;
  int64_t pp_peak = -1;
  for (const auto& rank : input.ranks) {
    const RankTime time = TimeOf(rank, steps);
    busy += time.busy_us;
    wall += time.wall_us;
    const double per_step_ms = time.steps > 0 ? 1e-3 / time.steps : 0.0;
    int64_t parameters = 0;
    for (const auto& item : rank.final_weights) parameters += item.value().numel();
    std::vector<std::string> stages;
    for (int stage : rank.stages) stages.push_back(std::to_string(stage));
    int64_t rank_peak = -1;
    for (int64_t bytes : rank.peak_bytes) rank_peak = std::max(rank_peak, bytes);
    pp_peak = std::max(pp_peak, rank_peak);
    report.ranks.push_back({scenario.name, std::to_string(rank.rank), fmt::format("{}", fmt::join(stages, ";")),
                            std::to_string(parameters), rank_peak >= 0 ? std::to_string(rank_peak) : "",
                            FormatNumber(time.busy_us * per_step_ms),
                            FormatNumber((time.wall_us - time.busy_us - time.comm_us) * per_step_ms),
                            FormatNumber(time.comm_us * per_step_ms)});
  }
  const int64_t ref_peak = reference.PeakBytes();
  row["ref_peak_bytes"] = ref_peak >= 0 ? std::to_string(ref_peak) : "";
  row["pp_peak_bytes_max"] = pp_peak >= 0 ? std::to_string(pp_peak) : "";
  // 1 - busy / wall over every rank and timed step.
  row["bubble_measured"] = FormatNumber(wall > 0 ? 1.0 - busy / wall : std::nan(""));
  const std::string zero_note =
      zero_names.empty() ? ""
                         : fmt::format("; {} parameter(s) with numerically zero gradients, final weights not compared: {}",
                                       zero_names.size(), fmt::join(zero_names, " "));
  row["message"] = failures.empty()
                       ? fmt::format("worst gradient {} at step {} (rel err {:.3g}){}", worst_param, worst_step,
                                     grad_max_rel, zero_note)
                       : failures.front() + (failures.size() > 1 ? fmt::format(" (+{} more)", failures.size() - 1) : "");
  return report;
}

}  // namespace pipecheck::harness
