// Summary rows from parity verdicts (see verdict.h).
#include "reports/verdict.h"

#include <fmt/format.h>

namespace pipecheck::reports {
namespace {

// After the first failure: how many more, and where the gradients went most wrong when that is
// not what the first says (a wrong boundary tensor first, the parameter it spoiled most after).
std::string MoreFailures(const ParityVerdict& verdict) {
  const size_t more = verdict.failures.size() - 1;
  if (more == 0) return "";
  if (!(verdict.grad_max_rel > verdict.tol) || verdict.worst_param.empty()) return fmt::format(" (+{} more)", more);
  return fmt::format(" (+{} more; worst gradient {} at step {} on {}: rel err {:.3g})", more, verdict.worst_param,
                     verdict.worst_step, verdict.worst_where, verdict.grad_max_rel);
}

// A passing row's message: its worst figures, judge by judge.
std::string PassMessage(const ParityVerdict& verdict) {
  return fmt::format("worst gradient {} at step {} (rel err {:.3g}); {}weights after each step match the reference's "
                     "update (worst rel err {:.3g}); {}",
                     verdict.worst_param, verdict.worst_step, verdict.grad_max_rel,
                     verdict.accumulation_max_rel
                         ? fmt::format("bfloat16 gradients summed as the reference's float32 sums (worst rel err "
                                       "{:.3g}), the loss as its float64 sum of terms (worst rel err {:.3g}); ",
                                       *verdict.accumulation_max_rel, verdict.accumulated_loss_max_rel.value_or(0.0))
                         : std::string(),
                     verdict.update_max_rel, verdict.trajectory_note) +
         (verdict.aux_loss_max_rel
              ? fmt::format("; the balance loss within rel err {:.3g} of the reference's", *verdict.aux_loss_max_rel)
              : std::string()) +
         (verdict.routing_adopted && *verdict.routing_adopted > 0
              ? fmt::format("; {} token choices decided within rounding taken from the trainer's routing",
                            *verdict.routing_adopted)
              : std::string()) +
         (verdict.expert_biases_checked
              ? fmt::format("; expert biases and their routing counts bitwise equal to the reference's ({} copies over "
                            "the steps)", *verdict.expert_biases_checked)
              : std::string()) +
         (verdict.resume_tensors_checked
              ? fmt::format("; at the resume before step {}, {} tensors loaded on {} rank{} {}", verdict.resume_step,
                            *verdict.resume_tensors_checked, verdict.resume_ranks, verdict.resume_ranks == 1 ? "" : "s",
                            verdict.resume_against)
              : std::string());
}

}  // namespace

bool MeetsExpectation(Status status, const std::string& expect) {
  return expect == "pass" ? status == Status::kPass || status == Status::kSkipped : status != Status::kPass;
}

void ApplyVerdict(const ParityVerdict& verdict, SummaryRow& row) {
  row.status = verdict.failures.empty() ? Status::kPass : Status::kFail;
  row.ok = MeetsExpectation(row.status, row.expect);
  row.tokens = verdict.tokens;
  row.loss_ref = verdict.loss_ref;
  row.loss_pp = verdict.loss_pp;
  row.loss_max_abs_diff = verdict.loss_max_abs_diff;
  row.grad_max_rel_err = verdict.grad_max_rel;
  row.worst_param = verdict.worst_param;
  row.params_checked = verdict.params_checked;
  row.weights_max_rel_err = verdict.update_max_rel;
  row.aux_loss_ref = verdict.aux_loss_ref;
  row.aux_loss_pp = verdict.aux_loss_pp;
  row.aux_loss_max_rel_err = verdict.aux_loss_max_rel;
  row.routing_adopted = verdict.routing_adopted;
  row.message = verdict.failures.empty() ? PassMessage(verdict) : verdict.failures.front() + MoreFailures(verdict);
  // A row that should have failed and passed must not read as a success in summary.csv.
  if (row.status == Status::kPass && row.expect == "fail") {
    row.message = "no failure found where one was expected (expect=fail): " + row.message;
  }
}

}  // namespace pipecheck::reports
