// Measured and predicted speed and memory (see measurements.h).
#include "harness/measurements.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

namespace pipecheck::harness {
namespace {

using reports::FormatNumber;

// One rank's time over the timed steps, from its executor timeline: compute, communication
// calls (posting receives, starting sends), and the rest of each step's wall time (waiting).
struct RankTime {
  double busy_us = 0.0, comm_us = 0.0, wall_us = 0.0;
  int steps = 0;
};

// A rank's timed steps by kind of work, in milliseconds summed over the steps: its timeline's
// compute actions (TimeOf has its waits and communication), or another trainer's actions_ms.
struct RankBreakdown {
  double forward = 0.0, backward = 0.0, input = 0.0, weight = 0.0, comm = 0.0, wait = 0.0, step = 0.0;
  int steps = 0;
};

// The first timed step of a rank's run: the one after its warm-up, which a run resumed from a
// checkpoint takes again at its first step.
size_t FirstTimed(const pipeline::RankResult& rank, size_t steps) {
  const size_t first = std::min(steps, static_cast<size_t>(std::max<int64_t>(0, rank.first_step)));
  return first + reference::FirstTimedStep(steps - first);
}

size_t FirstTimed(const std::vector<pipeline::RankResult>& ranks, size_t steps) {
  return ranks.empty() ? reference::FirstTimedStep(steps) : FirstTimed(ranks.front(), steps);
}

RankTime TimeOf(const pipeline::RankResult& rank, size_t steps) {
  RankTime time;
  std::map<int64_t, double> step_end;
  for (const auto& t : rank.timeline) {
    if (t.step < static_cast<int64_t>(FirstTimed(rank, steps))) continue;
    step_end[t.step] = std::max(step_end[t.step], t.end_us);
    (t.action.IsCompute() ? time.busy_us : time.comm_us) += t.end_us - t.start_us;
  }
  for (const auto& [step, end] : step_end) time.wall_us += end;
  time.steps = static_cast<int>(step_end.size());
  return time;
}

RankBreakdown BreakdownOf(const pipeline::RankResult& rank, size_t steps) {
  RankBreakdown breakdown;
  const size_t first = FirstTimed(rank, steps);
  std::set<int64_t> timed;
  for (const auto& t : rank.timeline) {
    if (t.step < static_cast<int64_t>(first)) continue;
    timed.insert(t.step);
    const double ms = (t.end_us - t.start_us) / 1000.0;
    switch (t.action.kind) {
      case pipeline::ActionKind::kForward: breakdown.forward += ms; break;
      case pipeline::ActionKind::kBackward: breakdown.backward += ms; break;
      case pipeline::ActionKind::kBackwardInput: breakdown.input += ms; break;
      case pipeline::ActionKind::kBackwardWeight: breakdown.weight += ms; break;
      default: break;  // communication: TimeOf's
    }
  }
  for (size_t k = first; k < rank.actions_ms.size(); ++k) {
    if (rank.actions_ms[k].empty()) continue;
    timed.insert(static_cast<int64_t>(k));
    for (const auto& [kind, ms] : rank.actions_ms[k]) {
      if (kind == "F") breakdown.forward += ms;
      if (kind == "B") breakdown.backward += ms;
      if (kind == "I") breakdown.input += ms;
      if (kind == "W") breakdown.weight += ms;
      if (kind == "COMM") breakdown.comm += ms;
      if (kind == "WAIT") breakdown.wait += ms;
    }
  }
  for (int64_t step : timed) {
    if (static_cast<size_t>(step) < rank.step_ms.size()) breakdown.step += rank.step_ms[static_cast<size_t>(step)];
  }
  breakdown.steps = static_cast<int>(timed.size());
  return breakdown;
}

const pipeline::MemoryPrediction& MemoryOf(const MeasurementInput& input, int replica) {
  if (input.replica_memory == nullptr || static_cast<size_t>(replica) >= input.replica_memory->size()) {
    return input.memory;
  }
  return (*input.replica_memory)[static_cast<size_t>(replica)];
}

// Bytes, or none where nothing was measured (-1).
std::optional<int64_t> Measured(int64_t bytes) { return bytes >= 0 ? std::optional<int64_t>(bytes) : std::nullopt; }

}  // namespace

reports::TimelineRow TimelineRowOf(const std::string& scenario, int64_t rank, const pipeline::ActionTiming& action,
                                   bool step_clock, std::optional<int64_t> held_predicted,
                                   std::optional<int64_t> peak_predicted) {
  reports::TimelineRow row;
  row.scenario = scenario;
  row.rank = rank;
  row.step = action.step;
  row.action = pipeline::KindText(action.action.kind);
  row.stage = action.action.stage;
  row.microbatch = action.action.microbatch;
  row.start_us = std::round(action.start_us);
  row.end_us = std::round(action.end_us);
  row.held_bytes = Measured(action.held_bytes);
  row.held_bytes_predicted = held_predicted;
  row.wait_start_us = std::round(action.wait_start_us);
  if (step_clock) row.step_start_us = std::round(action.step_start_us);
  row.peak_bytes = Measured(action.peak_bytes);
  row.peak_bytes_predicted = peak_predicted;
  return row;
}

namespace {

void TimelineRows(const MeasurementInput& input, reports::ScenarioReport& report) {
  for (const auto& rank : input.ranks) {
    if (rank.replica != 0) continue;
    std::map<int64_t, size_t> index_in_step;
    for (const auto& t : rank.timeline) {
      const size_t index = index_in_step[t.step]++;
      // The model's figure for this action, none where it has none (a schedule it did not see).
      auto predicted = [&](const std::vector<std::vector<std::vector<int64_t>>>& per_action) -> std::optional<int64_t> {
        if (t.step < 0 || static_cast<size_t>(t.step) >= per_action.size()) return std::nullopt;
        const auto& ranks = per_action[t.step];
        if (static_cast<size_t>(rank.rank) >= ranks.size() || index >= ranks[rank.rank].size()) return std::nullopt;
        return Measured(ranks[rank.rank][index]);
      };
      const auto row = TimelineRowOf(input.scenario.name, rank.rank, t, /*step_clock=*/true,
                                     predicted(input.memory.held_after), predicted(input.memory.peak_during));
      report.timeline.push_back(row);
    }
    // The data-parallel all-reduce, where the rank performed it.
    for (const auto& c : rank.collectives) {
      reports::TimelineRow row;
      row.scenario = input.scenario.name;
      row.rank = rank.rank;
      row.step = c.step;
      row.action = "ALLREDUCE";
      row.stage = -1;
      row.microbatch = -1;
      row.start_us = std::round(c.start_us);
      row.end_us = std::round(c.end_us);
      row.wait_start_us = row.start_us;
      row.step_start_us = std::round(c.step_start_us);
      report.timeline.push_back(row);
    }
  }
}

}  // namespace

StepPrediction PredictStepMs(const pipeline::Schedule& schedule, const std::vector<pipeline::RankResult>& ranks,
                             size_t steps) {
  const auto first = static_cast<int64_t>(FirstTimed(ranks, steps));
  if (ranks.size() != schedule.ranks.size()) return {};
  // [step][rank]: each action's measured duration, in list order, and the time after the last.
  std::map<int64_t, std::vector<std::vector<double>>> durations;
  std::map<int64_t, std::vector<double>> outside_ms;
  for (const auto& rank : ranks) {
    const auto r = static_cast<size_t>(rank.rank);
    if (r >= ranks.size()) return {};
    std::map<int64_t, double> last_end;
    for (const auto& t : rank.timeline) {
      if (t.step < first) continue;
      auto& step = durations[t.step];
      step.resize(ranks.size());
      step[r].push_back(t.end_us - t.start_us);
      last_end[t.step] = std::max(last_end[t.step], t.end_us);
    }
    for (const auto& [step, end] : last_end) {
      if (static_cast<size_t>(step) >= rank.step_ms.size()) return {};
      auto& outside = outside_ms[step];
      outside.resize(ranks.size(), std::nan(""));
      outside[r] = rank.step_ms[step] - end / 1000.0;
    }
  }
  StepPrediction prediction;
  std::vector<std::vector<double>> per_rank(ranks.size());  // [rank][timed step]
  std::vector<double> slowest;
  for (auto& [step, measured] : durations) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (measured[r].size() != schedule.ranks[r].size()) return {};  // a step that does not fit the list
    }
    pipeline::CostModel costs;
    costs.per_action = std::move(measured);
    const auto simulated = pipeline::Simulate(schedule, pipeline::SendSemantics::kBuffered, costs);
    if (!simulated.ok) return {};
    double step_ms = 0.0;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const double rank_ms = simulated.finish[r] / 1000.0 + outside_ms[step][r];
      per_rank[r].push_back(rank_ms);
      step_ms = std::max(step_ms, rank_ms);
    }
    slowest.push_back(step_ms);
  }
  if (slowest.empty()) return {};
  for (const auto& rank_ms : per_rank) prediction.rank_ms.push_back(reference::Median(rank_ms));
  prediction.step_ms = reference::Median(slowest);
  return prediction;
}

namespace {

// ranks.csv: each rank over the timed steps, its time busy, idle and communicating, its peak
// beside the memory model's.
void RankRows(const MeasurementInput& input, size_t steps, const StepPrediction& predicted,
              reports::ScenarioReport& report) {
  for (const auto& rank : input.ranks) {
    const RankTime time = TimeOf(rank, steps);
    const double per_step_ms = time.steps > 0 ? 1e-3 / time.steps : 0.0;
    int64_t parameters = 0;
    for (const auto& item : rank.final_weights) parameters += item.value().numel();
    std::vector<std::string> stages;
    for (int stage : rank.stages) stages.push_back(std::to_string(stage));
    int64_t rank_peak = -1;
    for (int64_t bytes : rank.peak_bytes) rank_peak = std::max(rank_peak, bytes);
    const size_t r = static_cast<size_t>(rank.rank);
    std::vector<double> rank_ms(rank.step_ms.begin() + std::min(rank.step_ms.size(), FirstTimed(rank, steps)),
                                rank.step_ms.end());
    reports::RankRow row;
    row.scenario = input.scenario.name;
    row.rank = rank.rank;
    row.replica = rank.replica;
    const auto& memory = MemoryOf(input, rank.replica);
    row.stages = fmt::format("{}", fmt::join(stages, ";"));
    row.params = parameters;
    row.peak_bytes = Measured(rank_peak);
    if (!rank.timeline.empty()) {
      row.busy_ms = time.busy_us * per_step_ms;
      row.idle_ms = (time.wall_us - time.busy_us - time.comm_us) * per_step_ms;
      row.comm_ms = time.comm_us * per_step_ms;
    }
    const RankBreakdown breakdown = BreakdownOf(rank, steps);
    if (breakdown.steps > 0) {
      const double per_step = 1.0 / breakdown.steps;
      row.forward_ms = breakdown.forward * per_step;
      row.backward_ms = breakdown.backward * per_step;
      row.input_grad_ms = breakdown.input * per_step;
      row.weight_grad_ms = breakdown.weight * per_step;
      if (rank.timeline.empty()) {  // another trainer's own account
        row.busy_ms = (breakdown.forward + breakdown.backward + breakdown.input + breakdown.weight) * per_step;
        row.idle_ms = breakdown.wait * per_step;
        row.comm_ms = breakdown.comm * per_step;
      }
      row.other_ms = breakdown.step * per_step - *row.busy_ms - *row.idle_ms - *row.comm_ms;
    }
    row.peak_bytes_predicted = Measured(r < memory.peak_bytes.size() ? memory.peak_bytes[r] : -1);
    if (!rank_ms.empty()) row.step_ms = reference::Median(rank_ms);
    if (r < predicted.rank_ms.size() && rank.replica == 0) row.step_ms_predicted = predicted.rank_ms[r];
    report.ranks.push_back(row);
  }
}

// The summary's memory and bubble: the largest peak of any rank, measured and predicted, and
// 1 - busy / wall over every rank and timed step.
void MemoryAndBubble(const MeasurementInput& input, const reference::TrainResult& reference, size_t steps,
                     reports::SummaryRow& row) {
  double busy = 0.0, wall = 0.0;
  int64_t pp_peak = -1, pp_peak_predicted = -1;
  for (const auto& rank : input.ranks) {
    const RankTime time = TimeOf(rank, steps);
    if (rank.replica == 0) {
      busy += time.busy_us;
      wall += time.wall_us;
    }
    for (int64_t bytes : rank.peak_bytes) pp_peak = std::max(pp_peak, bytes);
    const size_t r = static_cast<size_t>(rank.rank);
    const auto& memory = MemoryOf(input, rank.replica);
    if (r < memory.peak_bytes.size()) pp_peak_predicted = std::max(pp_peak_predicted, memory.peak_bytes[r]);
  }
  row.ref_peak_bytes = Measured(reference.PeakBytes());
  row.pp_peak_bytes_max = Measured(pp_peak);
  row.pp_peak_bytes_predicted = Measured(pp_peak_predicted);
  row.bubble_measured = wall > 0 ? 1.0 - busy / wall : std::nan("");
}

}  // namespace

void SpeedAndMemoryRows(const MeasurementInput& input, const reference::TrainResult& reference,
                        reports::ScenarioReport& report) {
  const size_t steps = reference.steps.size();
  // A pipeline step lasts as long as its slowest rank.
  std::vector<double> pp_ms, pp_rate;
  for (size_t k = FirstTimed(input.ranks, steps); k < steps; ++k) {
    double slowest = 0.0;
    for (const auto& rank : input.ranks) slowest = std::max(slowest, k < rank.step_ms.size() ? rank.step_ms[k] : 0.0);
    pp_ms.push_back(slowest);
    pp_rate.push_back(static_cast<double>(reference.steps[k].tokens) / (slowest / 1000.0));
  }
  // The timing-only steps after them (each the last judged step's batch again), where the judged
  // steps timed too few for a spread; every rank ran the same count.
  size_t timing = input.ranks.empty() ? 0 : input.ranks.front().timing_step_ms.size();
  for (const auto& rank : input.ranks) timing = std::min(timing, rank.timing_step_ms.size());
  for (size_t k = 0; k < timing && steps > 0; ++k) {
    double slowest = 0.0;
    for (const auto& rank : input.ranks) slowest = std::max(slowest, rank.timing_step_ms[k]);
    pp_ms.push_back(slowest);
    pp_rate.push_back(static_cast<double>(reference.steps[steps - 1].tokens) / (slowest / 1000.0));
  }
  TimelineRows(input, report);
  // Replica 0's ranks (every rank with one replica): what the schedule's lists index.
  const bool replicated = !input.ranks.empty() && input.ranks.front().replicas > 1;
  const auto first = replicated ? pipeline::ReplicaRanks(input.ranks, 0) : std::vector<pipeline::RankResult>();
  const StepPrediction predicted = PredictStepMs(input.schedule, replicated ? first : input.ranks, steps);
  auto& row = report.summary;
  row.ref_step_ms = reference.MedianStepMs();
  row.pp_step_ms = reference::Median(pp_ms);
  row.ref_tokens_per_s = reference.MedianTokensPerSecond();
  row.pp_tokens_per_s = reference::Median(pp_rate);
  // How far the timed steps' rates lie apart, relative to their median (robustly).
  if (pp_rate.size() >= 2) row.pp_tokens_per_s_spread = reports::RobustSpread(pp_rate);
  row.pp_tokens_per_s_runs = 1;
  row.pp_timed_steps = static_cast<int64_t>(pp_rate.size());
  row.bubble_theory = input.simulation.bubble;
  if (predicted.ok()) row.pp_step_ms_predicted = predicted.step_ms;
  RankRows(input, steps, predicted, report);
  MemoryAndBubble(input, reference, steps, row);
}

}  // namespace pipecheck::harness
