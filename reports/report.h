// The rows one scenario contributes to the run's reports, with the column sets docs/reports.md
// describes defined once, and the writers for summary.csv, params.csv, steps.csv, ranks.csv,
// timeline.csv, boundaries.csv and comm.csv. A failed or crashed scenario keeps its summary row
// with every column (unmeasured ones empty) and its message filled. Not a judge of parity: the
// harness fills the rows.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reports/fields.h"

namespace pipecheck::reports {

// One scenario's line of summary.csv. What was not measured (a scenario that failed before it
// ran, a column an older file lacks) is empty.
struct SummaryRow {
  std::string scenario;
  Status status = Status::kError;
  std::string expect = "pass";
  bool ok = false;  // the status met the expectation
  int64_t world_size = 1;
  std::string schedule;
  int64_t virtual_stages = 1;
  int64_t microbatches = 1;
  std::string dtype, device;
  int64_t steps = 0;
  std::optional<int64_t> tokens;
  std::optional<double> loss_ref, loss_pp, loss_max_abs_diff, grad_max_rel_err;
  std::string worst_param;
  std::optional<int64_t> params_checked;
  std::optional<double> weights_max_rel_err, ref_step_ms, pp_step_ms, ref_tokens_per_s, pp_tokens_per_s;
  std::optional<int64_t> ref_peak_bytes, pp_peak_bytes_max;
  std::optional<double> bubble_theory, bubble_measured;
  std::string message;
  std::string transport;
  std::optional<int64_t> pp_peak_bytes_predicted;
  std::optional<double> pp_step_ms_predicted, wall_s;
  // The tokens/s spread, relative to the median: a robust standard deviation (1.4826 x the
  // median absolute deviation) over one run's timed steps, or over merged runs (RobustSpread).
  std::optional<double> pp_tokens_per_s_spread;
  std::optional<int64_t> pp_tokens_per_s_runs;   // how many runs a baseline row merged
  std::string fingerprint, config;
  std::string trainer = "pipecheck";  // who trained: pipecheck, torch or external:PATH (as the suite says)
  int64_t data_parallel = 1;          // replicas of the pipeline
  bool recompute = false;             // activations recomputed in the backward
  int64_t accumulation = 1;           // rounds of the schedule per optimizer step
  std::optional<int64_t> pp_timed_steps;  // steps timed for tokens/s: judged after the warm-up, then timing-only
  // Mixture of experts: the balance loss's part of loss_ref and loss_pp (last step), and its worst
  // relative error over the steps at the pipeline's weights; empty without a balance loss.
  std::optional<double> aux_loss_ref, aux_loss_pp, aux_loss_max_rel_err;
  std::optional<int64_t> routing_adopted;  // mixture of experts: choices taken from the trainer within rounding
};

// The median of `values` (at least one).
double MedianOf(std::vector<double> values);

// How far `values` (tokens/s of timed steps, or of runs) lie apart, relative to their median:
// 1.4826 x the median absolute deviation over the median (a standard deviation where the values
// are normal, yet unmoved by a few outliers: one descheduled step among five does not widen
// it). NaN with fewer than two values.
double RobustSpread(const std::vector<double>& values);

// summary.csv's columns, in file order: the one list.
const Fields<SummaryRow>& SummaryFields();

// params.csv: a parameter's gradient against the reference's, at its worst step.
struct ParamRow {
  std::string scenario, param;
  int64_t stage = 0, rank = 0, numel = 0;
  double ref_norm = 0, pp_norm = 0, max_abs_diff = 0, rel_err = 0;
  bool ok = false;
  int64_t replica = 0;  // which replica of the pipeline held it (data_parallel > 1)
};
const Fields<ParamRow>& ParamFields();

// steps.csv: each step's loss, the reference's beside the pipeline's.
struct StepRow {
  std::string scenario;
  int64_t step = 0;
  double loss_ref = 0, loss_pp = 0, abs_diff = 0;
  // Which layout trained the step: 0 the row's own, i the one after its i-th resume (`resume`).
  int64_t layout = 0;
};
const Fields<StepRow>& StepFields();

// timeline.csv: one executed action; times in µs from its step's start (the step's own start on
// the run's clock), bytes held after it and the most held during it, beside the memory model's.
struct TimelineRow {
  std::string scenario;
  int64_t rank = 0, step = 0;
  std::string action;  // F, B, I, W, SEND_F, ...
  int64_t stage = 0, microbatch = 0;
  double start_us = 0, end_us = 0;
  std::optional<int64_t> held_bytes, held_bytes_predicted;
  double wait_start_us = 0;
  std::optional<double> step_start_us;  // none in a timeline read from flight records
  std::optional<int64_t> peak_bytes, peak_bytes_predicted;
  int64_t layout = 0;  // as StepRow's: which layout of a resumed run
};
const Fields<TimelineRow>& TimelineFields();

// ranks.csv: one rank over the timed steps.
struct RankRow {
  std::string scenario;
  int64_t rank = 0;
  std::string stages;  // "0;2"
  int64_t params = 0;
  std::optional<int64_t> peak_bytes;
  // Per timed step (means): computing, waiting for an input, communicating; from the rank's
  // action timeline, or another trainer's "actions_ms" (empty where it hands none back).
  std::optional<double> busy_ms, idle_ms, comm_ms;
  std::optional<int64_t> peak_bytes_predicted;
  std::optional<double> step_ms, step_ms_predicted;
  int64_t replica = 0;
  // busy_ms by kind of work (forwards with their loss, full backwards, a split backward's input
  // and weight halves), and the rest of the step (other_ms: outside the schedule's actions, the
  // optimizer, clipping and gradient sums among it), from the same source.
  std::optional<double> forward_ms, backward_ms, input_grad_ms, weight_grad_ms, other_ms;
};
const Fields<RankRow>& RankFields();

const std::vector<std::string>& SummaryColumns();
const std::vector<std::string>& ParamColumns();
const std::vector<std::string>& StepColumns();
const std::vector<std::string>& TimelineColumns();
const std::vector<std::string>& RankColumns();
const std::vector<std::string>& BoundaryColumns();
const std::vector<std::string>& CommColumns();

// boundaries.csv: a tensor that crossed a stage boundary (sent, received or handed over within a
// rank), fingerprinted, against the reference's tensor at the same place.
struct BoundaryRow {
  std::string scenario;
  int64_t step = 0, microbatch = 0, stage = 0;
  std::string direction, role;  // activation | gradient; sent | received | handed_over
  int64_t rank = 0;
  std::optional<int64_t> peer;  // none for a handover within a rank
  int64_t numel = 0;
  double ref_norm = 0, pp_norm = 0, ref_sum = 0, pp_sum = 0, ref_max_abs = 0, pp_max_abs = 0, rel_err = 0;
  std::optional<bool> bitwise_equal;  // none where either side was not hashed
  bool ok = false;
};
const Fields<BoundaryRow>& BoundaryFields();

// comm.csv: the message a rank posted at a place in its step, against the plan's.
struct CommRow {
  std::string scenario;
  int64_t rank = 0, step = 0, order = 0;
  std::string op;                // send | recv; "" where the rank posted nothing the plan has
  std::optional<int64_t> peer;
  std::string direction;
  int64_t stage = 0, microbatch = 0;
  std::string dtype, shape;      // as posted ("" when nothing was)
  std::optional<int64_t> bytes;
  std::string planned;           // the plan's message there, in words ("none")
  bool ok = false;
  int64_t replica = 0;
};
const Fields<CommRow>& CommFields();

struct ScenarioReport {
  SummaryRow summary;
  std::vector<ParamRow> params;
  std::vector<StepRow> steps;
  std::vector<TimelineRow> timeline;
  std::vector<RankRow> ranks;
  std::vector<BoundaryRow> boundaries;
  std::vector<CommRow> comm;

  // The summary's cell of `column`, as summary.csv writes it ("" for an unknown column).
  std::string Get(const std::string& column) const;
};

// JSON text and back, to hand a report from the rank that computed it to the launcher.
std::string ToJson(const ScenarioReport& report);
ScenarioReport FromJson(const std::string& text);

// Writes summary.csv, params.csv, steps.csv, ranks.csv, timeline.csv, boundaries.csv and comm.csv into `directory`
// atomically; returns their paths. (Each scenario's trace.json and timeline.svg are written
// once, when it finishes: reports/trace.h.)
std::vector<std::string> WriteReports(const std::string& directory, const std::vector<ScenarioReport>& reports);

}  // namespace pipecheck::reports
