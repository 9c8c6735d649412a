// Pipeline-versus-reference comparison (see parity.h).
#include "harness/parity.h"

#include "harness/boundaries.h"
#include "harness/comm_check.h"
#include "harness/measurements.h"
#include "harness/scenario_model.h"
#include "pipeline/checkpoint.h"
#include "reports/fields.h"
#include "reports/verdict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace pipecheck::harness {
namespace {

using reference::NamedTensors;
using reports::FormatNumber;

double Norm(const torch::Tensor& tensor) { return tensor.to(torch::kFloat64).norm().item<double>(); }

double GlobalNorm(const NamedTensors& tensors) {
  double squares = 0.0;
  for (const auto& item : tensors) squares += item.value().to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(squares);
}

// ||a - b|| over every name both hold.
double GlobalDistance(const NamedTensors& a, const NamedTensors& b) {
  double squares = 0.0;
  for (const auto& item : a) {
    if (!b.contains(item.key())) continue;
    squares += (item.value().to(torch::kFloat64) - b[item.key()].to(torch::kFloat64)).pow(2).sum().item<double>();
  }
  return std::sqrt(squares);
}

struct TensorError {
  double rel = 0.0;
  double max_abs = 0.0;
  double ref_norm = 0.0;
  double pp_norm = 0.0;
};

// ||pipeline - reference|| / max(scale, floor), where scale is what the error is relative to.
TensorError Compare(const torch::Tensor& pipeline, const torch::Tensor& reference, double scale, double floor) {
  auto difference = pipeline.to(torch::kFloat64) - reference.to(torch::kFloat64);
  TensorError error;
  error.ref_norm = Norm(reference);
  error.pp_norm = Norm(pipeline);
  error.max_abs = difference.numel() ? difference.abs().max().item<double>() : 0.0;
  const double distance = Norm(difference);
  const double denominator = std::max(scale, floor);
  error.rel = distance == 0.0 ? 0.0 : denominator > 0.0 ? distance / denominator : std::numeric_limits<double>::infinity();
  return error;
}

// `transport`: what the ranks ran over (the plan's); none given, what they would run over here.
reports::SummaryRow ScenarioColumns(const scenarios::Scenario& s, const std::optional<std::string>& transport) {
  std::vector<std::string> names, values;
  for (const auto& [name, value] : scenarios::SummaryValues(s)) names.push_back(name), values.push_back(value);
  auto row = reports::ParseCells(reports::SummaryFields(), names, values);
  row.config = scenarios::Configuration(s);
  row.fingerprint = scenarios::Fingerprint(row.config);
  if (s.ExternalTrainer()) {
    row.transport = "";  // another trainer picks its own
  } else {
    row.transport = transport ? *transport : ResolveTransport(s);
  }
  return row;
}

// Evidence, ordered as it appears: per-step evidence (step, kind) before the trajectory, so the
// first problem is the earliest wrong thing.
// Within a step, a message off the plan, then a wrong boundary tensor, come before the loss and
// gradients they made wrong.
enum class Evidence {
  kResume = -1,  // what a resumed run loaded, before the weights it starts from
  kStartWeights = 0,
  kCommunication = 1,
  kBoundary = 2,
  kRouting = 3,  // a mixture of experts' choices, beyond rounding (the boundaries downstream show it too)
  kLoss = 4,
  kGradients = 5,
  kUpdate = 6,
  kExpertBias = 7,  // the biases a step's routing counts moved, after its update
  kCollective = 8,  // after the gradients: their message names the parameter a skipped average left wrong
  kTrajectory = 9
};

class Problems {
 public:
  void Add(size_t step, Evidence kind, std::string message) {
    const bool trajectory = kind == Evidence::kTrajectory;
    found_[{trajectory ? 1 : 0, step, static_cast<int>(kind)}].push_back(std::move(message));
  }
  std::vector<std::string> InOrder() const {
    std::vector<std::string> all;
    for (const auto& [when, messages] : found_) all.insert(all.end(), messages.begin(), messages.end());
    return all;
  }

 private:
  std::map<std::tuple<int, size_t, int>, std::vector<std::string>> found_;
};

// A parameter's worst gradient error over the steps (for params.csv).
struct Worst {
  TensorError error;
  size_t step = 0;
  int64_t numel = 0;
};

// Everything the judges accumulate for one scenario: the verdict's figures as the reports take
// them, and what only the judges need on the way.
struct Verdicts {
  Problems problems;
  std::map<std::tuple<std::string, int, int>, Worst> worst_by_param;  // (name, replica, rank)
  reports::ParityVerdict figures;  // its failures are filled from `problems` at the end
  std::string diverged;            // non-empty: the reference diverged (an ERROR)
  double accumulation_max_rel = 0.0;  // reduced precision: against the reference's float32 sums
  double accumulated_loss_max_rel = 0.0;  // reduced precision: the loss against its float64 sum of terms
  double aux_loss_max_rel = 0.0;  // mixture of experts: the balance loss against the reference's
  int64_t expert_biases_checked = 0;  // expert bias copies compared (bitwise) over the steps
  int64_t routing_adopted = 0;  // token choices the reference took from the pipeline, within rounding
  // The first step whose judged reference took a choice from the pipeline: from there the
  // free-running reference follows its own routing, which the trajectory judge cannot hold it to.
  size_t first_adopted_step = std::numeric_limits<size_t>::max();
};

// Whether the balance loss is judged on its own: a mixture of experts with aux_loss > 0.
bool JudgesAuxLoss(const scenarios::Scenario& scenario) { return scenario.experts > 0 && scenario.aux_loss > 0.0; }

// The balance loss's part of the step's loss that the last stage's rank reported; NaN if none.
double AuxLossAt(const pipeline::RankResult& rank, size_t step) {
  return step < rank.aux_losses.size() ? rank.aux_losses[step] : std::nan("");
}

// 2d's tolerance, relative to each gradient's norm: bfloat16 keeps 8 significant bits (a
// rounding of up to 2^-9 = 2e-3 of a value), so a sum of m microbatches kept in bfloat16 drifts
// by several such roundings, while the pipeline and the reference differ by float32 sums only.
// Set between the two, measured on every pairwise combination of the trainer's features in
// bfloat16 (36 rows, 2 to 24 microbatches a replica): a correct pipeline at most 8.5e-5, sums
// kept in bfloat16 at least 2.0e-3; 4e-4 leaves 4.7x below and 5x above (docs/faults.md).
constexpr double kAccumulationTol = 4e-4;

// Whether 2d runs: reduced-precision rows of pipecheck's own trainer, which promises float32 sums
// (another trainer's accumulation dtype is its own business, judged by 2b's tolerance), on any
// device. On CUDA a correct pipeline sums a microbatch's gradient as the reference does too:
// measured on an H200 (PyTorch 2.11, CUDA 13) over scenarios/gpu.csv's bfloat16 rows, 20 steps at
// 8 and 16 microbatches among them, the distance was 0 on six rows and 7.2e-7 on the tied one.
bool JudgesAccumulation(const scenarios::Scenario& scenario) {
  return scenarios::DtypeOf(scenario.dtype).reduced && !scenario.ExternalTrainer();
}

const pipeline::RankResult& LossRank(const std::vector<pipeline::RankResult>& ranks) {
  const pipeline::RankResult* loss_rank = &ranks.back();
  for (const auto& rank : ranks) {
    const auto first = static_cast<size_t>(std::max<int64_t>(0, rank.first_step));
    if (first < rank.losses.size() && !std::isnan(rank.losses[first])) loss_rank = &rank;
  }
  return *loss_rank;
}

// The stage of `rank` that holds parameter `key` (NAME, or NAME@stageS for a rank's second copy).
int StageOfParameter(const std::string& key, const pipeline::RankResult& rank,
                     const std::vector<reference::SliceSpec>& slices) {
  const auto copy = key.find("@stage");
  if (copy != std::string::npos) return std::stoi(key.substr(copy + 6));
  const std::string name = pipeline::ParameterName(key);
  for (int stage : rank.stages) {
    if (stage < 0 || static_cast<size_t>(stage) >= slices.size()) continue;
    const auto& slice = slices[stage];
    if (name.rfind("layers.", 0) == 0) {
      const int64_t layer = std::stoll(name.substr(7));
      if (layer >= slice.first_layer && layer < slice.end_layer) return stage;
    } else if (name == "tok_embeddings.weight") {
      if (slice.has_embedding || slice.has_head) return stage;  // the head's copy where the rank has no embedding
    } else if (name.rfind("pos_embeddings", 0) == 0) {
      if (slice.has_embedding) return stage;
    } else if (slice.has_head) {
      return stage;  // norm, output
    }
  }
  return rank.stages.empty() ? 0 : rank.stages.front();
}

// "rank 1 (stage 1)", or "replica 1 rank 1 (stage 1)" with several replicas: who holds `key`.
std::string Where(const pipeline::RankResult& rank, const std::string& key,
                  const std::vector<reference::SliceSpec>& slices) {
  return fmt::format("{} (stage {})", rank.Who(), StageOfParameter(key, rank, slices));
}

double LossAt(const pipeline::RankResult& rank, size_t step) {
  return step < rank.losses.size() ? rank.losses[step] : std::nan("");
}

std::string Divergence(const reference::StepRecord& step, int64_t vocab) {
  const double limit = kDivergedLossFactor * std::log(static_cast<double>(vocab));
  if (std::isfinite(step.loss) && std::isfinite(step.grad_norm) && step.loss <= limit) return "";
  return fmt::format("loss {:.6g}, gradient norm {:.6g} (a sane loss stays under {:.0f} x ln(vocab) = {:.4g})",
                     step.loss, step.grad_norm, kDivergedLossFactor, limit);
}

// What `rank` held at the start of `step` (`steps` means after the last step); null when it
// reported nothing for that step.
const NamedTensors* WeightsAt(const pipeline::RankResult& rank, size_t step, size_t steps) {
  if (step >= steps) return &rank.final_weights;
  return step < rank.weights.size() ? &rank.weights[step] : nullptr;
}

// The weights every rank holds at `step` (the start of that step; `steps` means final), one
// copy per name. Copies of one name on several ranks (a tied weight) must be identical.
NamedTensors PipelineWeights(const std::vector<pipeline::RankResult>& ranks, size_t step, size_t steps,
                             Problems& problems) {
  NamedTensors merged;
  std::map<std::string, std::string> owner;
  for (const auto& rank : ranks) {
    const NamedTensors* held = WeightsAt(rank, step, steps);
    if (held == nullptr) {
      problems.Add(step, Evidence::kStartWeights, fmt::format("{} reported no weights for step {}", rank.Who(), step));
      continue;
    }
    for (const auto& item : *held) {
      const std::string name = pipeline::ParameterName(item.key());
      if (!torch::isfinite(item.value()).all().item<bool>()) {
        problems.Add(step, Evidence::kStartWeights,
                     fmt::format("weight {} on {} is not finite {}", item.key(), rank.Who(),
                                 step < steps ? fmt::format("at the start of step {}", step) : "after the last step"));
      }
      if (!merged.contains(name)) {
        merged.insert(name, item.value());
        owner[name] = rank.Who();
      } else if (!torch::equal(merged[name], item.value())) {
        // Copies are one weight (a tied weight's two owners) or one replica's weight and
        // another's: bitwise equal, or the pipeline has let them drift apart.
        problems.Add(step, Evidence::kStartWeights,
                     fmt::format("copies of {} differ between {} and {} {} (max abs diff {:.3g})",
                                 item.key(), owner[name], rank.Who(),
                                 step < steps ? fmt::format("at the start of step {}", step) : "after the last step",
                                 (merged[name].to(torch::kFloat64) - item.value().to(torch::kFloat64))
                                     .abs().max().item<double>()));
      }
    }
  }
  return merged;
}

// What the ranks recorded at `step` in `per_step` (gradients, master weights), one copy per name.
NamedTensors FirstCopies(const std::vector<pipeline::RankResult>& ranks, size_t step,
                         std::vector<NamedTensors> pipeline::RankResult::*per_step) {
  NamedTensors merged;
  for (const auto& rank : ranks) {
    const auto& steps = rank.*per_step;
    if (step >= steps.size()) continue;
    for (const auto& item : steps[step]) {
      const std::string name = pipeline::ParameterName(item.key());
      if (!merged.contains(name)) merged.insert(name, item.value());
    }
  }
  return merged;
}

// The gradients the pipeline applied at `step`, one copy per name.
NamedTensors AppliedGradients(const std::vector<pipeline::RankResult>& ranks, size_t step) {
  return FirstCopies(ranks, step, &pipeline::RankResult::gradients);
}

// What `rank` held of the expert biases at the start of `step` (`steps`: after the last step);
// null when it reported nothing for that step.
const NamedTensors* BiasesAt(const pipeline::RankResult& rank, size_t step, size_t steps) {
  if (step >= steps) return &rank.final_expert_biases;
  return step < rank.expert_biases.size() ? &rank.expert_biases[step] : nullptr;
}

// The expert biases the ranks held at the start of `step`, one copy per name (the per-rank
// verdicts of JudgeExpertBiases compare every copy).
NamedTensors PipelineBiases(const std::vector<pipeline::RankResult>& ranks, size_t step, size_t steps) {
  NamedTensors merged;
  for (const auto& rank : ranks) {
    const NamedTensors* held = BiasesAt(rank, step, steps);
    if (held == nullptr) continue;
    for (const auto& item : *held) {
      const std::string name = pipeline::ParameterName(item.key());
      if (!merged.contains(name)) merged.insert(name, item.value());
    }
  }
  return merged;
}

std::string Values(const torch::Tensor& tensor) {
  const auto values = tensor.to(torch::kCPU, torch::kFloat64).contiguous();
  std::vector<std::string> shown;
  for (int64_t i = 0; i < values.numel(); ++i) shown.push_back(fmt::format("{:.9g}", values.data_ptr<double>()[i]));
  return fmt::format("[{}]", fmt::join(shown, ", "));
}

// 2d'. The routing counts each rank moved its expert biases by at step k (after the replicas'
// sum), bitwise against the reference's over the step's whole batch at the pipeline's weights and
// biases. A count that doubles every expert's (a recomputed forward counted again) leaves the
// biases' signs, so it shows here first; a user's balance metrics read these counts.
void JudgeExpertCounts(size_t step, const std::vector<pipeline::RankResult>& ranks,
                       const std::map<int64_t, torch::Tensor>& expected, const std::vector<reference::SliceSpec>& slices,
                       Verdicts& verdicts) {
  for (const auto& rank : ranks) {
    if (step >= rank.expert_counts.size()) {
      verdicts.problems.Add(step, Evidence::kExpertBias,
                            fmt::format("{} reported no routing counts for step {}", rank.Who(), step));
      continue;
    }
    for (const auto& item : rank.expert_counts[step]) {
      const auto found = expected.find(reference::LayerOfName(item.key()));
      if (found != expected.end() && torch::equal(item.value().cpu().to(torch::kInt64), found->second.cpu())) continue;
      verdicts.problems.Add(
          step, Evidence::kExpertBias,
          fmt::format("routing counts {} on {} at step {}: pipeline {} vs reference {} over the step's whole batch "
                      "(padding excluded)",
                      item.key(), Where(rank, item.key(), slices), step, Values(item.value()),
                      found == expected.end() ? std::string("(none)") : Values(found->second)));
    }
  }
}

// 2d. Auxiliary-loss-free balancing (expert_bias): every copy of every MoE layer's bias after
// step k (the start of k + 1), bitwise, against where the reference's routing counts of step k's
// batch at the pipeline's weights and biases move the biases the pipeline started k with. The
// counts are integers and the move is one rounding of one formula: no tolerance. `expected`
// empty: step 0's start, against the reference's initial biases.
void JudgeExpertBiases(size_t step, const std::vector<pipeline::RankResult>& ranks, const NamedTensors& expected,
                       const std::map<int64_t, torch::Tensor>& counts, size_t steps,
                       const std::vector<reference::SliceSpec>& slices, Verdicts& verdicts) {
  std::set<std::string> seen;
  for (const auto& rank : ranks) {
    const NamedTensors* after = BiasesAt(rank, step + 1, steps);
    if (after == nullptr) {
      verdicts.problems.Add(step, Evidence::kExpertBias,
                            fmt::format("{} reported no expert biases after step {}", rank.Who(), step));
      continue;
    }
    for (const auto& item : *after) {
      const std::string name = pipeline::ParameterName(item.key());
      seen.insert(name);
      if (!expected.contains(name)) {
        verdicts.problems.Add(step, Evidence::kExpertBias,
                              fmt::format("{} holds an expert bias {} the reference has not", rank.Who(), item.key()));
        continue;
      }
      const auto& reference = expected[name];
      ++verdicts.expert_biases_checked;
      if (item.value().scalar_type() == reference.scalar_type() && torch::equal(item.value().cpu(), reference.cpu())) {
        continue;
      }
      const auto found = counts.find(reference::LayerOfName(name));
      verdicts.problems.Add(
          step, Evidence::kExpertBias,
          fmt::format("expert bias {} on {} after step {}: pipeline {} ({}) vs reference {} ({}), moved by the "
                      "reference's routing counts {} over the step's whole batch",
                      item.key(), Where(rank, item.key(), slices), step, Values(item.value()),
                      c10::toString(item.value().scalar_type()), Values(reference),
                      c10::toString(reference.scalar_type()),
                      found == counts.end() ? std::string("(none)") : Values(found->second)));
    }
  }
  for (const auto& item : expected) {
    if (!seen.count(item.key())) {
      verdicts.problems.Add(step, Evidence::kExpertBias,
                            fmt::format("expert bias {} is held by no rank after step {}", item.key(), step));
    }
  }
}

// The pipeline's routing of step `step`'s whole batch, for the reference to give way to where its
// own choice is decided within `tol` (RoutingSuggestion): each rank's choices of each of its
// replica's microbatches, placed at the microbatch's sequences and positions; -1 where none.
// Empty where no rank handed its routing back (another trainer).
reference::RoutingSuggestion PipelineRouting(const std::vector<pipeline::RankResult>& ranks, size_t step,
                                             const pipeline::PipelineConfig& config, double tol) {
  reference::RoutingSuggestion suggestion;
  suggestion.tolerance = tol;
  const bool any = std::any_of(ranks.begin(), ranks.end(), [&](const pipeline::RankResult& rank) {
    return step < rank.routing.size() && !rank.routing[step].is_empty();
  });
  if (!any) return suggestion;
  const auto lengths = reference::MakeLengths(config.train.data, config.train.seed, static_cast<int64_t>(step));
  const int64_t batch = lengths.size(0), time = lengths.max().item<int64_t>();
  const auto sizes = reference::MicrobatchSizes(batch, static_cast<int64_t>(config.data_parallel) * config.microbatches);
  std::vector<int64_t> firsts(sizes.size(), 0);
  for (size_t m = 1; m < sizes.size(); ++m) firsts[m] = firsts[m - 1] + sizes[m - 1];
  for (const auto& rank : ranks) {
    if (step >= rank.routing.size()) continue;
    for (const auto& item : rank.routing[step]) {
      const int64_t layer = reference::LayerOfName(item.key());
      const size_t global = static_cast<size_t>(rank.replica) * static_cast<size_t>(config.microbatches) +
                            static_cast<size_t>(pipeline::RoutingMicrobatch(item.key()));
      TORCH_CHECK(layer >= 0 && global < sizes.size(), rank.Who(), " handed back routing '", item.key(),
                  "' for no microbatch of step ", step);
      const auto& chosen = item.value();  // (sequences · padded length, k)
      const int64_t sequences = sizes[global], k = chosen.size(1);
      auto& whole = suggestion.choices[layer];
      if (!whole.defined()) whole = torch::full({batch, time, k}, -1, torch::kInt64);
      whole.slice(0, firsts[global], firsts[global] + sequences)
          .slice(1, 0, chosen.size(0) / sequences)
          .copy_(chosen.view({sequences, -1, k}));
    }
  }
  return suggestion;
}

// 2a''. Routing: a token whose choice the pipeline and the reference made differently, where the
// reference's own k-th/(k+1)-th margin lies beyond rounding (the reference took the pipeline's
// choice where it lay within, counted in routing_adopted).
void JudgeRouting(size_t step, const reference::StepRecord& at_pipeline, Verdicts& verdicts) {
  verdicts.routing_adopted += at_pipeline.routing_adopted;
  if (at_pipeline.routing_adopted > 0) verdicts.first_adopted_step = std::min(verdicts.first_adopted_step, step);
  if (at_pipeline.routing_beyond == 0) return;
  verdicts.problems.Add(step, Evidence::kRouting,
                        fmt::format("routing at step {}: {} token choice(s) differ from the reference's beyond "
                                    "rounding; the first at {}",
                                    step, at_pipeline.routing_beyond, at_pipeline.routing_first_beyond));
}

// 1. The pipeline starts from the reference's initial weights.
void JudgeInitialWeights(const NamedTensors& pipeline_start, const NamedTensors& initial, double tol,
                         Verdicts& verdicts) {
  for (const auto& item : initial) {
    if (!pipeline_start.contains(item.key())) {
      verdicts.problems.Add(0, Evidence::kStartWeights, fmt::format("weight {} is held by no rank", item.key()));
      continue;
    }
    const auto error = Compare(pipeline_start[item.key()], item.value(), Norm(item.value()), 0.0);
    if (!(error.rel <= tol)) {
      verdicts.problems.Add(0, Evidence::kStartWeights,
                            fmt::format("initial weight {}: rel err {:.3g} > tol {:.3g} against the reference's init",
                                        item.key(), error.rel, tol));
    }
  }
}

// 2a'. The balance loss (mixture of experts) of step k at the pipeline's weights, on its own:
// the total of 2a holds it, but it is a small share of the loss (about aux_loss per MoE layer),
// so a wrong balance loss can hide within the loss's tolerance. Relative to its own size.
void JudgeAuxLoss(size_t step, double aux_pp, double aux_ref, double tol, Verdicts& verdicts) {
  const double rel = std::abs(aux_pp - aux_ref) / std::abs(aux_ref);
  verdicts.aux_loss_max_rel = std::max(verdicts.aux_loss_max_rel, std::isnan(rel) ? INFINITY : rel);
  if (!(rel <= tol)) {
    verdicts.problems.Add(step, Evidence::kLoss,
                          fmt::format("balance loss at step {}: pipeline {:.12g} vs reference {:.12g} at the same "
                                      "weights (rel err {:.3g} > tol {:.3g})",
                                      step, aux_pp, aux_ref, rel, tol));
  }
}

// 2a. The loss of step k at the pipeline's weights.
void JudgeLoss(size_t step, double loss_pp, double loss_ref, double tol, Verdicts& verdicts) {
  const double diff = std::abs(loss_pp - loss_ref);
  if (!(diff <= tol * std::max(1.0, std::abs(loss_ref)))) {
    verdicts.problems.Add(step, Evidence::kLoss,
                          fmt::format("loss at step {}: pipeline {:.12g} vs reference {:.12g} at the same weights "
                                      "(diff {:.3g} > tol {:.3g})",
                                      step, loss_pp, loss_ref, diff, tol));
  }
}

// 2b. Every parameter's gradient of step k at the pipeline's weights, on every rank holding it.
void JudgeGradients(size_t step, const std::vector<pipeline::RankResult>& ranks, const NamedTensors& reference,
                    const std::vector<reference::SliceSpec>& slices, const scenarios::Scenario& scenario,
                    Verdicts& verdicts) {
  const double tol = scenario.tol;
  const double floor = scenarios::DtypeOf(scenario.dtype).floor_fraction * GlobalNorm(reference);
  std::map<std::string, int> seen;
  for (const auto& rank : ranks) {
    if (step >= rank.gradients.size()) {
      verdicts.problems.Add(step, Evidence::kGradients, fmt::format("{} reported no gradients for step {}", rank.Who(), step));
      continue;
    }
    for (const auto& item : rank.gradients[step]) {
      const std::string name = pipeline::ParameterName(item.key());
      ++seen[name];
      if (!reference.contains(name)) {
        verdicts.problems.Add(step, Evidence::kGradients,
                              fmt::format("{} has a gradient for {}, which the reference does not", rank.Who(), name));
        continue;
      }
      const auto& ref = reference[name];
      const auto error = Compare(item.value(), ref, Norm(ref), floor);
      auto& worst = verdicts.worst_by_param[{name, rank.replica, rank.rank}];
      if (error.rel >= worst.error.rel) worst = {error, step, ref.numel()};
      if (error.rel > verdicts.figures.grad_max_rel || verdicts.figures.worst_param.empty()) {
        auto& worst = verdicts.figures;
        worst.grad_max_rel = error.rel, worst.worst_param = name, worst.worst_step = step;
        worst.worst_where = Where(rank, item.key(), slices);
      }
      if (error.pp_norm == 0.0 && error.ref_norm > floor) {
        verdicts.problems.Add(step, Evidence::kGradients,
                              fmt::format("gradient of {} at step {} is all zero on {}; the reference's norm is {:.3g}",
                                          item.key(), step, Where(rank, item.key(), slices), error.ref_norm));
      } else if (!(error.rel <= tol)) {
        verdicts.problems.Add(step, Evidence::kGradients,
                              fmt::format("gradient of {} at step {} on {}: rel err {:.3g} > tol {:.3g}", item.key(),
                                          step, Where(rank, item.key(), slices), error.rel, tol));
      }
    }
  }
  for (const auto& item : reference) {
    if (!seen.count(item.key())) {
      verdicts.problems.Add(step, Evidence::kGradients,
                            fmt::format("gradient of {} at step {} is missing from every rank", item.key(), step));
    }
  }
}

// 2c. The weights after step k against one reference optimizer step from the weights the
// pipeline started step k with, applying the gradients it applied. Error relative to the
// update's size (floored like gradients), so a wrong optimizer shows at any learning rate.
// With `master` the float32 master weights a trainer steps stand in for its weights, judged in
// float32 at float32's tolerance (the arithmetic is float32's, whatever the parameters' dtype).
void JudgeUpdate(size_t step, const std::vector<pipeline::RankResult>& ranks, const NamedTensors& before,
                 const NamedTensors& predicted, size_t steps, const std::vector<reference::SliceSpec>& slices,
                 const scenarios::Scenario& scenario, bool master, Verdicts& verdicts) {
  const scenarios::DtypeTraits float32 = scenarios::DtypeOf("float32");  // by value: GCC 13 flags a reference (-Wdangling-reference)
  const std::string dtype = master ? float32.name : scenario.dtype;
  const double tol = master ? std::min(scenario.tol, float32.default_tol) : scenario.tol;
  const double floor = scenarios::DtypeOf(dtype).floor_fraction * GlobalDistance(predicted, before);
  for (const auto& rank : ranks) {
    const NamedTensors* after = master ? (step < rank.master_weights.size() ? &rank.master_weights[step] : nullptr)
                                       : WeightsAt(rank, step + 1, steps);
    if (after == nullptr) continue;  // reported by PipelineWeights or MasterWeights
    for (const auto& item : *after) {
      const std::string name = pipeline::ParameterName(item.key());
      if (!predicted.contains(name)) continue;
      const auto& expected = predicted[name];
      const double update = Norm(expected.to(torch::kFloat64) - before[name].to(torch::kFloat64));
      const auto error = Compare(item.value(), expected, update, floor);
      verdicts.figures.update_max_rel = std::max(verdicts.figures.update_max_rel, error.rel);
      if (!(error.rel <= tol)) {
        verdicts.problems.Add(step, Evidence::kUpdate,
                              fmt::format("update of {}{} at step {} on {}: rel err {:.3g} > tol {:.3g} against one "
                                          "reference optimizer step{} with the same gradients",
                                          master ? "the float32 master weight of " : "", item.key(), step,
                                          Where(rank, item.key(), slices), error.rel, tol, master ? " in float32" : ""));
      }
    }
  }
}

// Whether the trainer handed back float32 master weights (every rank every step, checked here).
bool HandsBackMasterWeights(const std::vector<pipeline::RankResult>& ranks, size_t steps, Problems& problems) {
  const bool any = std::any_of(ranks.begin(), ranks.end(), [](const auto& rank) { return !rank.master_weights.empty(); });
  if (!any) return false;
  for (const auto& rank : ranks) {
    if (rank.master_weights.size() != steps) {
      problems.Add(0, Evidence::kStartWeights,
                   fmt::format("{} handed back master weights for {} of {} steps while other ranks handed them back",
                               rank.Who(), rank.master_weights.size(), steps));
    }
  }
  return true;
}

// 2d. A trainer with master weights holds, after each step, exactly its master weights rounded to
// the parameters' dtype: a copy-back that skips a parameter or rounds another way shows here.
void JudgeMasterCopies(size_t step, const std::vector<pipeline::RankResult>& ranks, size_t steps,
                       const std::vector<reference::SliceSpec>& slices, Verdicts& verdicts) {
  for (const auto& rank : ranks) {
    const NamedTensors* weights = WeightsAt(rank, step + 1, steps);
    if (weights == nullptr || step >= rank.master_weights.size()) continue;
    const auto& master = rank.master_weights[step];
    for (const auto& item : *weights) {
      if (!master.contains(item.key())) {
        verdicts.problems.Add(step, Evidence::kUpdate,
                              fmt::format("{} handed back no master weight of {} after step {}", rank.Who(), item.key(), step));
        continue;
      }
      const auto rounded = master[item.key()].to(item.value().scalar_type());
      if (!torch::equal(rounded, item.value())) {
        const double most = (rounded.to(torch::kFloat64) - item.value().to(torch::kFloat64)).abs().max().item<double>();
        verdicts.problems.Add(step, Evidence::kUpdate,
                              fmt::format("weight {} after step {} on {} is not its float32 master weight rounded to {} "
                                          "(they differ by up to {:.3g})",
                                          item.key(), step, Where(rank, item.key(), slices),
                                          c10::toString(item.value().scalar_type()), most));
      }
    }
  }
}

// 3. The free-running trajectory: losses every step and the final weights, within tol or within
// kEnvelopeFactor x the rounding envelope (computed only when tol alone is exceeded).
void JudgeTrajectory(const std::vector<pipeline::RankResult>& ranks, const NamedTensors& final_pp, Oracle& oracle,
                     const scenarios::Scenario& scenario, reports::ScenarioReport& report, Verdicts& verdicts) {
  const auto& reference = oracle.FreeRunning();
  const auto& loss_rank = LossRank(ranks);
  const size_t all_steps = reference.steps.size();
  // A mixture of experts whose routing took choices decided within rounding from the pipeline at
  // step a: the pipeline's trajectory follows those choices and the free-running reference its own,
  // so the trajectory is judged over the steps before a (the steps at the pipeline's weights
  // judge every step, a included).
  const size_t steps = std::min(all_steps, verdicts.first_adopted_step);
  const std::string why = fmt::format("from step {} on, the pipeline's routing took choices decided within rounding, "
                                      "which a free-running reference cannot follow", steps);
  const std::string unjudged = steps == all_steps ? std::string() : fmt::format(" over steps before {} ({})", steps, why);
  const double tol = scenario.tol;
  std::vector<double> diffs(all_steps);
  bool within_tol = true;
  // A run resumed at step first: the steps before it were judged with the layout that ran them.
  const size_t first = static_cast<size_t>(std::max<int64_t>(0, loss_rank.first_step));
  for (size_t k = first; k < all_steps; ++k) {
    const double loss_ref = reference.steps[k].loss, loss_pp = LossAt(loss_rank, k);
    diffs[k] = std::abs(loss_pp - loss_ref);
    report.steps.push_back({scenario.name, static_cast<int64_t>(k), loss_ref, loss_pp, diffs[k]});
    if (k >= steps) continue;
    double& worst = verdicts.figures.loss_max_abs_diff;
    worst = std::isnan(diffs[k]) ? diffs[k] : std::max(worst, diffs[k]);
    within_tol = within_tol && diffs[k] <= tol * std::max(1.0, std::abs(loss_ref));
  }
  const double weights_ref_norm = GlobalNorm(reference.final_weights);
  const double weights_rel = GlobalDistance(final_pp, reference.final_weights) / std::max(weights_ref_norm, 1e-300);
  within_tol = within_tol && (steps < all_steps || weights_rel <= tol);
  if (steps == 0) {
    verdicts.figures.trajectory_note = "trajectory not judged: " + why;
    return;
  }
  if (within_tol) {
    verdicts.figures.trajectory_note = "trajectory within tol" + unjudged;
    return;
  }
  // Past tol: measure how far rounding alone moves the trajectory.
  const auto& envelope = oracle.Envelope();
  double envelope_loss = 0.0;  // running max: rounding only accumulates
  for (size_t k = 0; k < steps; ++k) {
    const double loss_ref = reference.steps[k].loss;
    envelope_loss = std::max(envelope_loss, std::abs(envelope.steps[k].loss - loss_ref));
    const double allowed = std::max(tol * std::max(1.0, std::abs(loss_ref)), kEnvelopeFactor * envelope_loss);
    if (k >= first && !(diffs[k] <= allowed)) {
      verdicts.problems.Add(k, Evidence::kTrajectory,
                            fmt::format("trajectory: loss at step {}: pipeline {:.12g} vs free-running reference {:.12g} "
                                        "(diff {:.3g} > {:.3g} = max(tol, {:.0f} x rounding envelope {:.3g}))",
                                        k, LossAt(loss_rank, k), loss_ref, diffs[k], allowed, kEnvelopeFactor,
                                        envelope_loss));
    }
  }
  const double envelope_weights = GlobalDistance(envelope.final_weights, reference.final_weights) /
                                  std::max(weights_ref_norm, 1e-300);
  const double allowed = std::max(tol, kEnvelopeFactor * envelope_weights);
  if (steps == all_steps && !(weights_rel <= allowed)) {
    verdicts.problems.Add(steps, Evidence::kTrajectory,
                          fmt::format("trajectory: final weights rel diff {:.3g} from the free-running reference > "
                                      "{:.3g} = max(tol, {:.0f} x rounding envelope {:.3g})",
                                      weights_rel, allowed, kEnvelopeFactor, envelope_weights));
  }
  verdicts.figures.trajectory_note = fmt::format(
      "trajectory past tol but judged against the rounding envelope (loss {:.3g}, weights {:.3g}){}", envelope_loss,
      envelope_weights, unjudged);
}

// params.csv: one row per parameter copy (a tied weight has two: first and last stage).
void ParamRows(const ParityInput& input, const Verdicts& verdicts, reports::ScenarioReport& report) {
  for (const auto& rank : input.ranks) {
    for (const auto& item : rank.final_weights) {
      auto found = verdicts.worst_by_param.find({item.key(), rank.replica, rank.rank});
      if (found == verdicts.worst_by_param.end()) continue;
      const auto& w = found->second;
      const int stage = rank.stages.empty() ? 0 : rank.stages.front();
      report.params.push_back({input.scenario.name, item.key(), stage, rank.rank, w.numel, w.error.ref_norm,
                               w.error.pp_norm, w.error.max_abs, w.error.rel, w.error.rel <= input.scenario.tol,
                               rank.replica});
    }
  }
}

int ReplicasOf(const std::vector<pipeline::RankResult>& ranks) {
  return ranks.empty() ? 1 : std::max(1, ranks.front().replicas);
}

// "replica 1: " with several replicas, else nothing: the prefix of a replica's own verdict.
std::string ReplicaPrefix(int replicas, int replica) {
  return replicas > 1 ? fmt::format("replica {}: ", replica) : std::string();
}

// Each replica's ranks as the boundary judge reads them, made once for every step: their ranks
// and boundary records only. Replica r's microbatch m is the global batch's microbatch
// r x microbatches + m (the oracle cuts the batch into data_parallel x microbatches), and its
// records say so. A replica's loss terms are over the whole batch's tokens (the replicas'
// gradients are summed), so its boundary gradients are at the reference's scale, bits and all.
std::vector<std::vector<pipeline::RankResult>> BoundaryViews(const std::vector<pipeline::RankResult>& ranks,
                                                             int microbatches) {
  const int replicas = ReplicasOf(ranks);
  std::vector<std::vector<pipeline::RankResult>> views(static_cast<size_t>(replicas));
  for (const auto& rank : ranks) {
    pipeline::RankResult view;
    view.rank = rank.rank, view.replica = rank.replica, view.replicas = rank.replicas, view.stages = rank.stages;
    view.boundaries = rank.boundaries;
    for (auto& record : view.boundaries) {
      record.microbatch += rank.replica * microbatches;
    }
    views[static_cast<size_t>(rank.replica)].push_back(std::move(view));
  }
  return views;
}

// 2d. The tensors that crossed stage boundaries in step k against the reference's (boundaries.h),
// replica by replica (`views`: BoundaryViews). Judged when the ranks fingerprinted any, which needs
// an oracle tapping the same boundaries.
void JudgeStepBoundaries(const ParityInput& input, const pipeline::PipelineConfig& config,
                         const std::vector<reference::SliceSpec>& slices,
                         const std::vector<std::vector<pipeline::RankResult>>& views, size_t step,
                         const reference::StepRecord& at_pipeline, Verdicts& verdicts,
                         reports::ScenarioReport& report) {
  const bool recorded = std::any_of(input.ranks.begin(), input.ranks.end(),
                                    [](const pipeline::RankResult& rank) { return !rank.boundaries.empty(); });
  if (!recorded) return;
  TORCH_CHECK(input.oracle.config().boundary_layers == BoundaryLayers(slices),
              "the oracle must tap the pipeline's stage boundaries to judge them");
  const auto batch = reference::MakeBatch(input.oracle.config().data, input.oracle.config().seed,
                                          static_cast<int64_t>(step));
  const int replicas = static_cast<int>(views.size());
  for (int replica = 0; replica < replicas; ++replica) {
    auto verdict = JudgeBoundaries({input.scenario.name, step, views[static_cast<size_t>(replica)], at_pipeline, batch,
                                    config.microbatches * replicas, slices, config.train.dtype, input.scenario.tol});
    report.boundaries.insert(report.boundaries.end(), verdict.rows.begin(), verdict.rows.end());
    if (!verdict.first_problem.empty()) {
      verdicts.problems.Add(step, Evidence::kBoundary, ReplicaPrefix(replicas, replica) + verdict.first_problem);
    }
  }
}

// 2e. The messages every rank posted against the plan (comm_check.h), replica by replica, and
// with several replicas each rank's data-parallel all-reduce: one a step, of every gradient the
// rank holds, after its last backward.
void JudgeCommunication(const ParityInput& input, const pipeline::PipelineConfig& config, Verdicts& verdicts,
                        reports::ScenarioReport& report) {
  const int replicas = ReplicasOf(input.ranks);
  for (int replica = 0; replica < replicas; ++replica) {
    auto replica_config = config;
    replica_config.replica = replica;
    const auto mine = replicas == 1 ? std::vector<pipeline::RankResult>() : pipeline::ReplicaRanks(input.ranks, replica);
    auto verdict = CheckCommunication({input.scenario.name, replica_config, input.schedule,
                                       replicas == 1 ? input.ranks : mine});
    for (auto& row : verdict.rows) row.replica = replica;
    report.comm.insert(report.comm.end(), verdict.rows.begin(), verdict.rows.end());
    for (size_t step = 0; step < verdict.first_problem.size(); ++step) {
      if (!verdict.first_problem[step].empty()) {
        verdicts.problems.Add(step, Evidence::kCommunication, ReplicaPrefix(replicas, replica) + verdict.first_problem[step]);
      }
    }
  }
  if (replicas == 1) return;
  auto verdict = CheckCollectives({input.scenario.name, input.ranks, static_cast<size_t>(input.scenario.steps)});
  report.comm.insert(report.comm.end(), verdict.rows.begin(), verdict.rows.end());
  for (size_t step = 0; step < verdict.first_problem.size(); ++step) {
    if (!verdict.first_problem[step].empty()) {
      verdicts.problems.Add(step, Evidence::kCollective, verdict.first_problem[step]);
    }
  }
}

// 2d. Reduced precision: every gradient of step k against the reference summing the pipeline's
// own microbatches as a correct pipeline must (float32 sums of each microbatch's bfloat16
// gradient), at a tolerance far below bfloat16's rounding, which the whole-batch comparison has to
// allow. What this sees and 2b cannot: sums kept in the parameter's dtype, a microbatch's
// gradient rounded once more than it should be. The tied weight is left to 2b: the reference sums
// its two uses inside each backward, in bfloat16, where the pipeline's two copies sum in float32.
void JudgeAccumulation(size_t step, const std::vector<pipeline::RankResult>& ranks, const NamedTensors& accumulated,
                       const std::vector<reference::SliceSpec>& slices, const scenarios::Scenario& scenario,
                       Verdicts& verdicts) {
  const double floor = scenarios::DtypeOf(scenario.dtype).floor_fraction * GlobalNorm(accumulated);
  for (const auto& rank : ranks) {
    if (step >= rank.gradients.size()) continue;  // reported by JudgeGradients
    for (const auto& item : rank.gradients[step]) {
      const std::string name = pipeline::ParameterName(item.key());
      if (!accumulated.contains(name) || (scenario.tied && name == "tok_embeddings.weight")) continue;
      const auto& ref = accumulated[name];
      const auto error = Compare(item.value(), ref, Norm(ref), floor);
      verdicts.accumulation_max_rel = std::max(verdicts.accumulation_max_rel, error.rel);
      if (!(error.rel <= kAccumulationTol)) {
        verdicts.problems.Add(step, Evidence::kGradients,
                              fmt::format("gradient of {} at step {} on {}: rel err {:.3g} > {:.3g} against the "
                                          "reference summing the same microbatches in float32 (a sum in {}?)",
                                          item.key(), step, Where(rank, item.key(), slices), error.rel,
                                          kAccumulationTol, scenario.dtype));
      }
    }
  }
}

// 2d, the loss: the step's reported loss against the reference summing the same microbatches'
// terms in float64, at 2d's tolerance. The whole-batch loss of 2a differs from the pipeline's by
// bfloat16's rounding of every activation, so 2a's tolerance cannot see terms added in bfloat16
// (a partial sum near 5 is rounded to 1/32); against the microbatched reference only the order of
// float64 additions differs.
void JudgeAccumulatedLoss(size_t step, double loss_pp, double loss_ref, const scenarios::Scenario& scenario,
                          Verdicts& verdicts) {
  const double rel = std::abs(loss_pp - loss_ref) / std::max(1.0, std::abs(loss_ref));
  verdicts.accumulated_loss_max_rel = std::max(verdicts.accumulated_loss_max_rel, std::isnan(rel) ? INFINITY : rel);
  if (!(rel <= kAccumulationTol)) {
    verdicts.problems.Add(step, Evidence::kLoss,
                          fmt::format("loss at step {}: pipeline {:.12g} vs reference {:.12g} summing the same "
                                      "microbatches' terms in float64 (rel err {:.3g} > {:.3g}: terms summed in {}?)",
                                      step, loss_pp, loss_ref, rel, kAccumulationTol, scenario.dtype));
  }
}

// A judge's state at the end of its stretch of a resumed run, for the next stretch's judge: the
// updater's optimizer state (UpdateFrom's, which has applied every gradient the pipeline applied
// since step 0) and the weights and expert biases the ranks ended with, under checkpoint keys.
void SaveJudgeState(const std::string& path, const Oracle& oracle, const NamedTensors& weights,
                    const NamedTensors& biases) {
  NamedTensors state;
  for (const auto& item : oracle.UpdaterState()) state.insert("optimizer/" + item.key(), item.value());
  for (const auto& item : weights) state.insert(pipeline::CheckpointKey("weight", item.key()), item.value());
  for (const auto& item : biases) state.insert(pipeline::CheckpointKey("expert_bias", item.key()), item.value());
  pipeline::WriteTensorFile(path, state);
}

// How two tensors that should be bitwise equal differ, in words ("" when they do not).
std::string BitwiseDifference(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.sizes() != want.sizes()) {
    return fmt::format("shape {} where {} was saved", c10::str(got.sizes()), c10::str(want.sizes()));
  }
  if (got.scalar_type() != want.scalar_type()) {
    return fmt::format("dtype {} where {} was saved", c10::toString(got.scalar_type()), c10::toString(want.scalar_type()));
  }
  const auto a = got.detach().cpu(), b = want.detach().cpu();
  if (torch::equal(a, b)) return "";
  if (a.numel() == 1 && !a.is_floating_point()) return fmt::format("{} where {} was saved", a.item<int64_t>(), b.item<int64_t>());
  const auto unequal = a.ne(b);
  return fmt::format("{} of {} elements differ, max abs diff {:.3g}", unequal.sum().item<int64_t>(), a.numel(),
                     (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>());
}

// A checkpoint key in words: "AdamW's step count of NAME", "weight NAME".
std::string InWords(const std::string& key) {
  const auto [part, name] = pipeline::SplitCheckpointKey(key);
  if (part == "step") return "AdamW's step count of " + name;
  if (part == "exp_avg" || part == "exp_avg_sq") return fmt::format("AdamW's {} of {}", part, name);
  if (part == "expert_bias") return "expert bias " + name;
  return part + " " + name;
}

// At a resume before step k: the checkpoint against where the previous layout's ranks ended (the
// previous judge's state: their weights, expert biases and the optimizer step counts), then what
// every rank of this layout loaded against the checkpoint, all bitwise; each replica's data
// position must be step k of its own share. The updater carries on from the previous judge's state,
// so the update judged at step k is the one a run that never stopped makes.
// Returns the expert biases the previous ranks ended with (a trainer that hands back none at the
// resume starts from them).
NamedTensors JudgeResume(const ParityInput& input, const Segment& segment, Verdicts& verdicts) {
  const size_t step = static_cast<size_t>(segment.first_step);
  const std::string at = fmt::format("resume before step {}", step);
  const NamedTensors ended = pipeline::ReadTensorFile(segment.judge_state_in);
  NamedTensors updater;
  for (const auto& item : ended) {
    const std::string prefix = "optimizer/";
    if (item.key().rfind(prefix, 0) == 0) updater.insert(item.key().substr(prefix.size()), item.value());
  }
  input.oracle.SetUpdaterState(updater);
  std::optional<pipeline::CheckpointContents> saved;
  std::string unreadable;  // why the checkpoint cannot be loaded, said with the first parameter it cost
  // Another trainer writes its own format: what its ranks loaded is held to where the previous
  // ranks ended, its optimizer state by the update judged after the resume.
  const bool own_format = !input.scenario.ExternalTrainer();
  try {
    if (own_format) saved = pipeline::ReadCheckpoint(segment.load_checkpoint);
  } catch (const pipeline::CheckpointError& error) {
    unreadable = fmt::format("{}: the checkpoint cannot be loaded ({}), yet the ranks loaded it", at, error.what());
  }
  verdicts.figures.resume_against =
      own_format ? "(weights, AdamW's moments and step counts, expert biases, data positions) bitwise equal to the "
                   "checkpoint"
                 : "(weights) bitwise equal to those the previous layout's ranks ended with";
  // 1. What was saved against where the previous layout's ranks ended.
  if (saved) {
    for (const auto& item : ended) {
      const auto [part, name] = pipeline::SplitCheckpointKey(item.key());
      std::string key = item.key();
      if (part == "optimizer") {
        if (pipeline::SplitCheckpointKey(name).first != "step") continue;  // moments: judged by the next update
        key = name;
      }
      if (!saved->tensors.contains(key)) {
        verdicts.problems.Add(step, Evidence::kResume, fmt::format("{}: the checkpoint holds no {}", at, key));
        continue;
      }
      const std::string differs = BitwiseDifference(saved->tensors[key], item.value());
      if (!differs.empty()) {
        verdicts.problems.Add(step, Evidence::kResume,
                              fmt::format("{}: the checkpoint's {} is not what the ranks ended step {} with: {}", at,
                                          InWords(key), step - 1, differs));
      }
    }
    for (size_t r = 0; r < saved->data.size(); ++r) {
      const auto& data = saved->data[r];
      if (!data.contains("next_step") || data["next_step"].item<int64_t>() != segment.first_step) {
        verdicts.problems.Add(step, Evidence::kResume,
                              fmt::format("{}: replica {}'s saved data position is not step {}", at, r, step));
      }
    }
  }
  // 2. What each rank loaded against what was saved (or, where the checkpoint cannot be read,
  // its weights against where the previous ranks ended).
  auto& checked = verdicts.figures.resume_tensors_checked;
  checked = 0;
  verdicts.figures.resume_step = segment.first_step;
  verdicts.figures.resume_ranks = static_cast<int64_t>(input.ranks.size());
  for (const auto& rank : input.ranks) {
    *checked += static_cast<int64_t>(rank.loaded.size());
    if (rank.loaded.is_empty()) {
      verdicts.problems.Add(step, Evidence::kResume, fmt::format("{}: {} handed back no loaded state", at, rank.Who()));
      continue;
    }
    for (const auto& item : rank.loaded) {
      const std::string key = pipeline::ParameterName(item.key());
      const auto part = pipeline::SplitCheckpointKey(key).first;
      const std::string stage = item.key() == key ? "" : item.key().substr(key.size());
      const std::string who = fmt::format("{}{}", rank.Who(), stage.empty() ? "" : " (" + stage.substr(1) + ")");
      if (part == "data") {
        const int64_t value = item.value().item<int64_t>();
        if (key == "data/next_step" && value != segment.first_step) {
          verdicts.problems.Add(step, Evidence::kResume,
                                fmt::format("{}: {} loaded data position {}, so its next step trains on batch {} "
                                            "instead of {}", at, rank.Who(), value, value, step));
        }
        if (key == "data/replica" && value != rank.replica) {
          verdicts.problems.Add(step, Evidence::kResume,
                                fmt::format("{}: {} loaded replica {}'s data position: it trains on that replica's "
                                            "share of every batch, not its own", at, rank.Who(), value));
        }
        continue;
      }
      const NamedTensors* truth = saved ? &saved->tensors : nullptr;
      if (truth == nullptr) {
        if (part != "weight" && part != "expert_bias") continue;
        truth = &ended;
      }
      if (!truth->contains(key)) {
        verdicts.problems.Add(step, Evidence::kResume,
                              fmt::format("{}: {} loaded {}, which {} holds no value for", at, who, key,
                                          saved ? "the checkpoint" : "the previous ranks' end state"));
        continue;
      }
      const std::string differs = BitwiseDifference(item.value(), (*truth)[key]);
      if (differs.empty()) continue;
      const std::string what = fmt::format("{} loaded {} unlike {}: {}", who, InWords(key),
                                           saved ? "the checkpoint's" : "where the previous ranks ended", differs);
      if (!unreadable.empty()) {
        verdicts.problems.Add(step, Evidence::kResume, fmt::format("{}: {}", unreadable, what));
        unreadable.clear();
      } else {
        verdicts.problems.Add(step, Evidence::kResume, fmt::format("{}: {}", at, what));
      }
    }
    // Optimizer state the checkpoint holds for a parameter the rank loaded none for.
    if (!saved) continue;
    for (const auto& item : rank.loaded) {
      const auto [part, name] = pipeline::SplitCheckpointKey(pipeline::ParameterName(item.key()));
      if (part != "weight") continue;
      const std::string moments = pipeline::CheckpointKey("exp_avg", name);
      const std::string loaded_key = pipeline::CheckpointKey("exp_avg", pipeline::SplitCheckpointKey(item.key()).second);
      if (saved->tensors.contains(moments) && !rank.loaded.contains(loaded_key)) {
        verdicts.problems.Add(step, Evidence::kResume,
                              fmt::format("{}: {} loaded no optimizer state for {}, which the checkpoint holds", at,
                                          rank.Who(), pipeline::SplitCheckpointKey(item.key()).second));
      }
    }
  }
  if (!unreadable.empty()) {
    verdicts.problems.Add(step, Evidence::kResume, unreadable + ", every weight as the previous ranks ended");
  }
  NamedTensors biases;
  for (const auto& item : ended) {
    const auto [part, name] = pipeline::SplitCheckpointKey(item.key());
    if (part == "expert_bias") biases.insert(name, item.value());
  }
  return biases;
}

// Steps 1 and 2 of the header comment, every step in order. Returns the pipeline's final
// weights (one copy per name), already checked for finiteness and identical tied copies.
NamedTensors JudgeSteps(const ParityInput& input, const pipeline::PipelineConfig& config, Verdicts& verdicts,
                        reports::ScenarioReport& report) {
  const auto slices = pipeline::StageSlicesOf(config, input.schedule.shape);
  const auto boundary_views = BoundaryViews(input.ranks, config.microbatches);
  const auto& scenario = input.scenario;
  const size_t steps = static_cast<size_t>(scenario.steps);
  const auto& loss_rank = LossRank(input.ranks);
  const Segment* segment = input.segment;
  const size_t first = segment != nullptr ? static_cast<size_t>(segment->first_step) : 0;
  NamedTensors start = PipelineWeights(input.ranks, first, steps, verdicts.problems);
  if (first == 0) JudgeInitialWeights(start, input.oracle.InitialWeights(), scenario.tol, verdicts);
  // A trainer that steps float32 master weights starts them from its weights, widened.
  const bool master = HandsBackMasterWeights(input.ranks, steps, verdicts.problems);
  NamedTensors master_start;
  if (master) {
    for (const auto& item : start) master_start.insert(item.key(), item.value().to(torch::kFloat32));
  }
  const bool biased = scenario.expert_bias > 0.0;
  NamedTensors bias_start = biased ? PipelineBiases(input.ranks, first, steps) : NamedTensors();
  if (first > 0) {
    const NamedTensors ended_biases = JudgeResume(input, *segment, verdicts);
    if (biased && bias_start.is_empty()) bias_start = ended_biases;  // a trainer that hands none back
  }
  for (const auto& item : first > 0 ? NamedTensors() : input.oracle.InitialExpertBiases()) {
    if (!bias_start.contains(item.key()) || !torch::equal(bias_start[item.key()].cpu(), item.value().cpu())) {
      verdicts.problems.Add(0, Evidence::kStartWeights,
                            fmt::format("expert bias {} does not start at the reference's zeros", item.key()));
    }
  }
  for (size_t k = first; k < steps; ++k) {
    const auto routing = PipelineRouting(input.ranks, k, config, scenario.tol);
    const auto at_pipeline = input.oracle.EvaluateAt(start, bias_start, routing, static_cast<int64_t>(k));
    const std::string diverged = Divergence(at_pipeline, scenario.vocab);
    if (!diverged.empty()) {
      verdicts.diverged = fmt::format("reference diverged at step {} at the pipeline's weights: {}", k, diverged);
      return NamedTensors();
    }
    JudgeStepBoundaries(input, config, slices, boundary_views, k, at_pipeline, verdicts, report);
    JudgeRouting(k, at_pipeline, verdicts);
    JudgeLoss(k, LossAt(loss_rank, k), at_pipeline.loss, scenario.tol, verdicts);
    if (JudgesAuxLoss(scenario)) JudgeAuxLoss(k, AuxLossAt(loss_rank, k), at_pipeline.aux_loss, scenario.tol, verdicts);
    JudgeGradients(k, input.ranks, at_pipeline.gradients, slices, scenario, verdicts);
    if (JudgesAccumulation(scenario)) {
      const auto accumulated = input.oracle.EvaluateAccumulatedAt(start, bias_start, routing, static_cast<int64_t>(k));
      JudgeAccumulation(k, input.ranks, accumulated.gradients, slices, scenario, verdicts);
      JudgeAccumulatedLoss(k, LossAt(loss_rank, k), accumulated.loss, scenario, verdicts);
    }
    if (master) {
      const auto predicted = input.oracle.UpdateMasterFrom(master_start, AppliedGradients(input.ranks, k));
      JudgeUpdate(k, input.ranks, master_start, predicted, steps, slices, scenario, /*master=*/true, verdicts);
      JudgeMasterCopies(k, input.ranks, steps, slices, verdicts);
      master_start = FirstCopies(input.ranks, k, &pipeline::RankResult::master_weights);
    } else {
      const auto predicted = input.oracle.UpdateFrom(start, AppliedGradients(input.ranks, k));
      JudgeUpdate(k, input.ranks, start, predicted, steps, slices, scenario, /*master=*/false, verdicts);
    }
    if (biased) {
      JudgeExpertCounts(k, input.ranks, at_pipeline.expert_counts, slices, verdicts);
      JudgeExpertBiases(k, input.ranks, at_pipeline.expert_biases, at_pipeline.expert_counts, steps, slices, verdicts);
      bias_start = PipelineBiases(input.ranks, k + 1, steps);
    }
    start = PipelineWeights(input.ranks, k + 1, steps, verdicts.problems);
  }
  if (segment != nullptr && !segment->judge_state_out.empty()) {
    SaveJudgeState(segment->judge_state_out, input.oracle, start, bias_start);
  }
  return start;
}

// 4. The memory model's own accounting: the parameter elements it counts on each rank against
// those the rank handed back. Not a verdict on the trainer: a model that miscounts a rank's
// parameters mispredicts that rank's weights, gradients and optimizer state, which is pipecheck's
// error, whatever parity says. Empty where every count agrees or nothing was predicted.
std::string MemoryModelMiscount(const ParityInput& input) {
  for (const auto& rank : input.ranks) {
    const auto* memory = &input.memory;
    if (input.replica_memory != nullptr && static_cast<size_t>(rank.replica) < input.replica_memory->size()) {
      memory = &(*input.replica_memory)[static_cast<size_t>(rank.replica)];
    }
    const size_t r = static_cast<size_t>(rank.rank);
    if (r >= memory->params.size()) continue;  // not predicted (another trainer's row)
    int64_t held = 0;
    for (const auto& item : rank.final_weights) held += item.value().numel();
    if (held == memory->params[r]) continue;
    return fmt::format("pipecheck's memory model counts {} parameter elements on {}, which holds {}: its predicted "
                       "peak for that rank (weights, gradients, optimizer state) is wrong",
                       memory->params[r], rank.Who(), held);
  }
  return "";
}

}  // namespace

reports::ScenarioReport FailedScenarioReport(const scenarios::Scenario& scenario, reports::Status status,
                                             const std::string& message, const std::optional<std::string>& transport) {
  reports::ScenarioReport report;
  report.summary = ScenarioColumns(scenario, transport);
  report.summary.status = status;
  report.summary.ok = reports::MeetsExpectation(status, scenario.expect);
  report.summary.message = message;
  return report;
}

reports::ScenarioReport CompareWithReference(const ParityInput& input) {
  const auto& scenario = input.scenario;
  // The free-running reference first: if it diverges, no parity verdict means anything.
  const auto& reference = input.oracle.FreeRunning();
  for (const auto& step : reference.steps) {
    const std::string diverged = Divergence(step, scenario.vocab);
    if (!diverged.empty()) {
      return FailedScenarioReport(scenario, reports::Status::kError,
                                  fmt::format("reference diverged at step {}: {}; lower lr or enable clip", step.step,
                                              diverged),
                                  input.transport);
    }
  }
  Verdicts verdicts;
  reports::ScenarioReport report;
  auto config = input.pipeline_config != nullptr ? *input.pipeline_config
                : input.transport                ? ToPipelineConfig(scenario, *input.transport)
                                                 : ToPipelineConfig(scenario);
  if (input.segment != nullptr) config.first_step = input.segment->first_step;
  if (input.check_communication) JudgeCommunication(input, config, verdicts, report);
  const NamedTensors final_pp = JudgeSteps(input, config, verdicts, report);
  if (!verdicts.diverged.empty()) {
    return FailedScenarioReport(scenario, reports::Status::kError, verdicts.diverged, input.transport);
  }
  report.summary = ScenarioColumns(scenario, input.transport);
  JudgeTrajectory(input.ranks, final_pp, input.oracle, scenario, report, verdicts);
  ParamRows(input, verdicts, report);
  SpeedAndMemoryRows({scenario, input.ranks, input.schedule, input.simulation, input.memory, input.replica_memory},
                     reference, report);

  reports::ParityVerdict verdict = std::move(verdicts.figures);
  verdict.failures = verdicts.problems.InOrder();
  verdict.tol = scenario.tol;
  if (JudgesAccumulation(scenario)) {
    verdict.accumulation_max_rel = verdicts.accumulation_max_rel;
    verdict.accumulated_loss_max_rel = verdicts.accumulated_loss_max_rel;
  }
  if (JudgesAuxLoss(scenario)) {
    verdict.aux_loss_max_rel = verdicts.aux_loss_max_rel;
    verdict.aux_loss_ref = reference.steps.back().aux_loss;
    verdict.aux_loss_pp = AuxLossAt(LossRank(input.ranks), reference.steps.size() - 1);
  }
  if (input.scenario.expert_bias > 0.0) verdict.expert_biases_checked = verdicts.expert_biases_checked;
  if (input.scenario.experts > 0) verdict.routing_adopted = verdicts.routing_adopted;
  for (const auto& step : reference.steps) verdict.tokens += step.tokens;
  verdict.loss_ref = reference.steps.back().loss;
  verdict.loss_pp = LossAt(LossRank(input.ranks), reference.steps.size() - 1);
  verdict.params_checked = static_cast<int64_t>(reference.final_weights.size());
  reports::ApplyVerdict(verdict, report.summary);
  if (const std::string miscount = MemoryModelMiscount(input); !miscount.empty()) {
    report.summary.message = fmt::format("{} (parity: {}: {})", miscount, reports::StatusName(report.summary.status),
                                         report.summary.message);
    report.summary.status = reports::Status::kError;
    report.summary.ok = reports::MeetsExpectation(report.summary.status, scenario.expect);
  }
  return report;
}

}  // namespace pipecheck::harness
