// The single-device reference trainer (see trainer.h).
#include "reference/trainer.h"

#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "reference/attention_core.h"
#include "reference/device.h"
#include "reference/host_memory.h"
#include "reference/linear.h"
#include "reference/loss.h"

namespace pipecheck::reference {
namespace {

NamedTensors DetachedCopies(const NamedTensors& tensors) {
  NamedTensors copies;
  for (const auto& item : tensors) copies.insert(item.key(), RecordedCopy(item.value()));
  return copies;
}

// Median of `value(step)` over the timed steps; 0 when there are none.
template <typename Value>
double MedianOverTimedSteps(const std::vector<StepRecord>& steps, Value value) {
  std::vector<double> values;
  for (size_t i = FirstTimedStep(steps.size()); i < steps.size(); ++i) values.push_back(value(steps[i]));
  return values.empty() ? 0.0 : Median(std::move(values));
}

}  // namespace

size_t FirstTimedStep(size_t steps) { return steps > 1 ? 1 : 0; }

double Median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

double TrainResult::MedianStepMs() const {
  return MedianOverTimedSteps(steps, [](const StepRecord& step) { return step.step_ms; });
}

double TrainResult::MedianTokensPerSecond() const {
  return MedianOverTimedSteps(steps, [](const StepRecord& step) { return step.tokens / (step.step_ms / 1000.0); });
}

PhaseTimes TrainResult::MedianPhaseMs() const {
  PhaseTimes medians;
  for (size_t i = FirstTimedStep(steps.size()); i < steps.size(); ++i) {
    for (const auto& [phase, ms] : steps[i].phase_ms) {
      const bool seen = std::any_of(medians.begin(), medians.end(), [&](const auto& m) { return m.first == phase; });
      if (seen) continue;
      medians.emplace_back(phase, MedianOverTimedSteps(steps, [&phase](const StepRecord& step) {
                             for (const auto& [name, value] : step.phase_ms) {
                               if (name == phase) return value;
                             }
                             return 0.0;
                           }));
    }
  }
  return medians;
}

void PhaseClock::Start() {
  if (!on_) return;
  Synchronize(device_);
  times_.clear();
  last_ = std::chrono::steady_clock::now();
}

void PhaseClock::Mark(const std::string& phase) {
  if (!on_) return;
  Synchronize(device_);
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
  for (auto& [name, total] : times_) {
    if (name == phase) {
      total += ms;
      return;
    }
  }
  times_.emplace_back(phase, ms);
}

PhaseTimes PhaseClock::Take() { return std::exchange(times_, {}); }

int64_t TrainResult::PeakBytes() const {
  int64_t peak = -1;
  for (const auto& step : steps) peak = std::max(peak, step.peak_bytes);
  return peak;
}

ReferenceTrainer::ReferenceTrainer(const TrainConfig& config)
    : config_(config), baseline_bytes_(HeldTensorBytes(config.device)), phases_(config.phase_times, config.device) {
  CheckDtypeSupported(config.dtype, config.device);
  TORCH_CHECK(!(config.phase_times && config.check_host_syncs),
              "phase times synchronise the device at every phase, which the host-sync check forbids");
  TORCH_CHECK(config.microbatches >= 1 && config.microbatches <= config.data.batch, "the reference accumulates over ",
              config.microbatches, " microbatches, which needs 1 to batch (", config.data.batch, ")");
  TORCH_CHECK(config.boundary_layers.empty() || config.microbatches == 1,
              "boundary taps need the whole batch in one piece (microbatches 1, not ", config.microbatches, ")");
  model_ = BuildSlice(config.model, WholeModel(config.model), config.seed, config.dtype, config.device);
  model_->SetTaps(config.boundary_layers);
  parameters_ = model_->parameters();
  optimizer_ = MakeOptimizer(config.optimizer, parameters_);
  accumulator_ = std::make_unique<GradientAccumulator>(parameters_);
}

torch::Tensor ReferenceTrainer::ForwardBackward(const Batch& batch) { return ForwardBackward(batch, batch.valid_tokens); }

torch::Tensor ReferenceTrainer::ForwardBackward(const Batch& batch, int64_t normalising_tokens) {
  return ForwardBackward(batch, [&](const torch::Tensor& logits, const torch::Tensor& labels) {
    return TokenLossSum(logits, labels) / static_cast<double>(normalising_tokens);
  });
}

torch::Tensor ReferenceTrainer::ForwardBackward(const Batch& batch, const torch::Tensor& sequence_weights) {
  return ForwardBackward(batch, [&](const torch::Tensor& logits, const torch::Tensor& labels) {
    auto per_sequence = TokenLosses(logits, labels).sum(1);
    return (per_sequence * ToDevice(sequence_weights, config_.device).to(per_sequence.scalar_type())).sum();
  });
}

torch::Tensor ReferenceTrainer::ForwardBackward(const Batch& batch, const LossOf& loss_of) {
  const auto device = config_.device;
  const HostSyncCheck no_host_syncs(config_.check_host_syncs, device);
  auto context = MakeAttentionContext(config_.model, batch.lengths, batch.time(), config_.dtype, device,
                                      step_sequences_ > 0 ? step_sequences_ : batch.size());
  if (config_.model.HasExperts()) context.moe = std::make_shared<MoeRecord>();
  for (const auto& [layer, choices] : suggestion_.choices) {
    // This (micro)batch's rows and positions of the whole batch's suggestion.
    auto part = choices.slice(0, part_first_, part_first_ + batch.size()).slice(1, 0, batch.time());
    context.suggested_routing[layer] = ToDevice(part.reshape({-1, part.size(2)}).contiguous(), device);
    context.routing_tolerance = suggestion_.tolerance;
  }
  auto tokens = ToDevice(batch.tokens, device);
  phases_.Mark("data");
  auto logits = model_->forward(tokens, context);  // (B, T, vocab)
  phases_.Mark("forward");
  auto loss = loss_of(logits, ToDevice(batch.labels, device));
  if (context.moe) {
    adopted_ += context.moe->adopted;
    beyond_ += context.moe->beyond;
    if (first_beyond_.empty()) first_beyond_ = context.moe->first_beyond;
    for (const auto& [layer, counts] : context.moe->counts) {
      auto& sum = counts_[layer];
      sum = sum.defined() ? sum + counts : counts;
    }
  }
  if (const auto aux = context.moe ? context.moe->BalanceLoss() : torch::Tensor(); aux.defined()) {
    // The balance loss joins the objective: its gradient enters the same backward.
    const auto value = aux.detach().to(torch::kFloat64);
    aux_sum_ = aux_sum_.defined() ? aux_sum_ + value : value;
    loss = loss + aux.to(loss.scalar_type());
  }
  phases_.Mark("loss");
  {
    const FusedWeightGradients fused;  // a later microbatch adds its weight gradients in place
    const SingleWalkBackward once;     // the graph goes with this backward
    loss.backward();
  }
  phases_.Mark("backward");
  return loss.detach();
}

torch::Tensor MicrobatchMeanWeights(const Batch& batch, int64_t microbatches) {
  const auto labelled = (batch.labels != kIgnoreIndex).sum(1).to(torch::kFloat64);  // (B,)
  auto weights = torch::empty({batch.size()}, torch::kFloat64);
  int64_t first = 0;
  for (int64_t size : MicrobatchSizes(batch.size(), microbatches)) {
    const double tokens = labelled.slice(0, first, first + size).sum().item<double>();
    TORCH_CHECK(tokens > 0, "microbatch_mean: a microbatch of sequences ", first, "..", first + size - 1,
                " has no labelled token");
    weights.slice(0, first, first + size).fill_(1.0 / (tokens * static_cast<double>(microbatches)));
    first += size;
  }
  return weights;
}

StepRecord ReferenceTrainer::ComputeGradients(int64_t step, PendingReads& pending) {
  accumulator_->Begin();
  auto batch = MakeBatch(config_.data, config_.seed, step);
  step_sequences_ = batch.size();
  aux_sum_ = torch::Tensor();
  counts_.clear();
  adopted_ = beyond_ = 0;
  first_beyond_.clear();
  part_first_ = 0;
  phases_.Mark("data");
  StepRecord record;
  record.step = step;
  record.tokens = batch.valid_tokens;
  const bool microbatch_mean = config_.loss_microbatches > 0;
  const auto weights = microbatch_mean ? MicrobatchMeanWeights(batch, config_.loss_microbatches) : torch::Tensor();
  if (config_.microbatches == 1) {
    pending.loss = microbatch_mean ? ForwardBackward(batch, weights) : ForwardBackward(batch);
    for (auto& [layer, hidden] : model_->TakeTaps()) record.boundaries[layer] = {hidden.detach(), hidden.grad()};
  } else {
    // The pipeline's arithmetic: microbatches in order, each normalised by the whole batch (or by
    // its own tokens, microbatch_mean). The loss is summed on the device and read once.
    torch::Tensor loss_sum;
    int64_t first = 0;
    for (const auto& part : SplitMicrobatches(batch, config_.microbatches)) {
      part_first_ = first;
      auto term = (microbatch_mean ? ForwardBackward(part, weights.slice(0, first, first + part.size()))
                                   : ForwardBackward(part, batch.valid_tokens))
                      .to(torch::kFloat64);
      first += part.size();
      loss_sum = loss_sum.defined() ? loss_sum + term : term;
      accumulator_->AfterBackward();
      phases_.Mark("accumulate");
    }
    pending.loss = loss_sum;
  }
  accumulator_->Finish();
  pending.aux = aux_sum_;
  record.expert_counts = counts_;
  record.routing_adopted = adopted_;
  record.routing_beyond = beyond_;
  record.routing_first_beyond = first_beyond_;
  record.expert_biases = MovedExpertBiases();
  phases_.Mark("accumulate");
  if (config_.device.is_cuda() && config_.clip <= 0.0) {
    pending.squares = GradSquares(parameters_);  // the norm is reported, not used: read after the step
  } else {
    Settle(record, pending);  // the clip factor needs the norm now; on the CPU waiting costs nothing
    record.grad_norm = std::sqrt(GradSquaredSum(parameters_));
    ScaleGradients(parameters_, ClipFactor(record.grad_norm, config_.clip));
  }
  phases_.Mark("grad_norm");
  return record;
}

void ReferenceTrainer::Settle(StepRecord& record, PendingReads& pending) {
  if (pending.loss.defined()) record.loss = pending.loss.item<double>();
  if (pending.aux.defined()) record.aux_loss = pending.aux.item<double>();
  if (pending.squares.defined()) record.grad_norm = std::sqrt(SumOnHost(pending.squares));
  pending = PendingReads();
}

StepRecord ReferenceTrainer::Step(int64_t step) {
  StepWindow window(baseline_bytes_, config_.device);
  phases_.Start();
  PendingReads pending;
  StepRecord record = ComputeGradients(step, pending);
  if (config_.record_gradients) {
    window.PauseForCopies();
    record.gradients = Gradients();
    window.ResumeAfterCopies();
    phases_.Mark("copies");
  }
  GradientsToParameterDtype(parameters_);
  phases_.Mark("accumulate");
  DeterministicStep(*optimizer_);
  SetExpertBiases(record.expert_biases);  // after the optimizer step, by the step's counts
  phases_.Mark("optimizer");
  Settle(record, pending);
  phases_.Mark("read_back");
  const auto measured = window.End();
  record.phase_ms = phases_.Take();
  record.peak_bytes = measured.peak_bytes;
  record.step_ms = measured.step_ms;
  return record;
}

NamedTensors ReferenceTrainer::MovedExpertBiases() const {
  NamedTensors moved;
  if (config_.model.expert_bias <= 0.0) return moved;
  for (const auto& item : ExpertBiases()) {
    const int64_t layer = LayerOfName(item.key());
    TORCH_CHECK(counts_.count(layer), "no routing counts for ", item.key());
    moved.insert(item.key(), MovedExpertBias(item.value(), counts_.at(layer), config_.model.expert_bias));
  }
  return moved;
}

StepRecord ReferenceTrainer::Evaluate(int64_t step) {
  PendingReads pending;
  StepRecord record = ComputeGradients(step, pending);
  Settle(record, pending);
  record.gradients = Gradients();
  return record;
}

void ReferenceTrainer::SetWeights(const NamedTensors& weights) {
  torch::NoGradGuard no_grad;
  auto named = model_->named_parameters();
  for (const auto& item : weights) {
    TORCH_CHECK(named.contains(item.key()), "the reference model has no parameter ", item.key());
    named[item.key()].copy_(item.value());
  }
}

void ReferenceTrainer::ApplyGradients(const NamedTensors& gradients) {
  auto named = model_->named_parameters();
  for (auto& parameter : parameters_) parameter.mutable_grad().reset();
  for (const auto& item : gradients) {
    TORCH_CHECK(named.contains(item.key()), "the reference model has no parameter ", item.key());
    named[item.key()].mutable_grad() = item.value().detach().clone().to(named[item.key()].device());
  }
  GradientsToParameterDtype(parameters_);
  DeterministicStep(*optimizer_);
}

TrainResult ReferenceTrainer::Train() {
  TrainResult result;
  for (int64_t step = 0; step < config_.steps; ++step) result.steps.push_back(Step(step));
  result.final_weights = Weights();
  result.final_expert_biases = ExpertBiases();
  return result;
}

NamedTensors ReferenceTrainer::Weights() const { return DetachedCopies(model_->named_parameters()); }

NamedTensors ReferenceTrainer::Gradients() const {
  NamedTensors gradients;
  for (const auto& item : model_->named_parameters()) {
    if (item.value().grad().defined()) gradients.insert(item.key(), RecordedCopy(item.value().grad()));
  }
  return gradients;
}

NamedTensors ReferenceTrainer::OptimizerState() const {
  NamedTensors state;
  for (const auto& item : model_->named_parameters()) {
    const auto saved = StateOf(*optimizer_, item.value());
    if (!saved.present) continue;
    state.insert("exp_avg/" + item.key(), saved.exp_avg);
    state.insert("exp_avg_sq/" + item.key(), saved.exp_avg_sq);
    state.insert("step/" + item.key(), torch::scalar_tensor(saved.step, torch::kInt64));
  }
  return state;
}

void ReferenceTrainer::SetOptimizerState(const NamedTensors& state) {
  for (const auto& item : model_->named_parameters()) {
    ParameterState set;
    const std::string avg = "exp_avg/" + item.key();
    if (state.contains(avg)) {
      set.present = true;
      set.exp_avg = state[avg];
      set.exp_avg_sq = state["exp_avg_sq/" + item.key()];
      set.step = state["step/" + item.key()].item<int64_t>();
    }
    SetState(*optimizer_, item.value(), set);
  }
}

}  // namespace pipecheck::reference
