// A scenario's parity verdict as the judges hand it to the reports: what went wrong, in the order
// it happened, and the figures of the closest agreement the judges measured. The summary row's
// status, ok, message and judged figures are written from it here alone, so that every row words
// its outcome the same way and the judges build no report text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reports/report.h"

namespace pipecheck::reports {

struct ParityVerdict {
  std::vector<std::string> failures;  // each judge's finding, earliest first; none: PASS
  double tol = 0.0;                   // the gradient judges' tolerance
  // The worst gradient error against the reference, and where it was.
  double grad_max_rel = 0.0;
  std::string worst_param;
  std::string worst_where;  // who held it: "replica 1 rank 0 (stage 0)"
  size_t worst_step = 0;
  double update_max_rel = 0.0;      // each step's weights against the reference's update
  double loss_max_abs_diff = 0.0;   // the free-running trajectory
  std::string trajectory_note;      // how the trajectory was judged
  std::optional<double> accumulation_max_rel;  // set where reduced-precision sums were judged
  std::optional<double> accumulated_loss_max_rel;  // the loss against its microbatch terms' float64 sum, there
  // What was run and compared.
  int64_t tokens = 0;
  double loss_ref = 0.0;
  double loss_pp = 0.0;
  int64_t params_checked = 0;
  // Mixture of experts with a balance loss: its last step's value on each side, and its worst
  // relative error over the steps at the pipeline's weights.
  std::optional<double> aux_loss_ref, aux_loss_pp, aux_loss_max_rel;
  // Auxiliary-loss-free balancing: the expert biases (and the routing counts that moved them)
  // judged bitwise after each step: how many copies were compared over the run.
  std::optional<int64_t> expert_biases_checked;
  // Mixture of experts: token choices the reference took from the trainer because its own were
  // decided within rounding (over every step).
  std::optional<int64_t> routing_adopted;
  // A run resumed from a checkpoint: the tensors its ranks loaded, each held bitwise to the
  // checkpoint, on how many ranks, at which step.
  std::optional<int64_t> resume_tensors_checked;
  int64_t resume_ranks = 0;
  int64_t resume_step = 0;
  std::string resume_against;  // what they were held to, in words
};

// Whether `status` meets `expect` ("pass": PASS or SKIPPED; "fail": FAIL, ERROR or TIMEOUT).
bool MeetsExpectation(Status status, const std::string& expect);

// The row's status (PASS without failures, else FAIL), ok against the row's expect, message and
// judged figures. The message is the first failure and how many more (with the worst gradient
// where the first failure is not it); a pass's message gives each judge's worst figure; a pass
// where a failure was expected says so first.
void ApplyVerdict(const ParityVerdict& verdict, SummaryRow& row);

}  // namespace pipecheck::reports
