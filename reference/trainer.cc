// The single-device reference trainer (see trainer.h).
#include "reference/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "reference/loss.h"

namespace pipecheck::reference {
namespace {

NamedTensors DetachedCopies(const NamedTensors& tensors) {
  NamedTensors copies;
  for (const auto& item : tensors) copies.insert(item.key(), item.value().detach().clone());
  return copies;
}

}  // namespace

double TrainResult::MedianStepMs() const {
  std::vector<double> times;
  for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) times.push_back(steps[i].step_ms);
  if (times.empty()) return 0.0;
  std::sort(times.begin(), times.end());
  const size_t middle = times.size() / 2;
  return times.size() % 2 == 1 ? times[middle] : 0.5 * (times[middle - 1] + times[middle]);
}

ReferenceTrainer::ReferenceTrainer(const TrainConfig& config) : config_(config) {
  CheckDtypeSupported(config.dtype, config.device);
  model_ = BuildSlice(config.model, WholeModel(config.model), config.seed, config.dtype, config.device);
  parameters_ = model_->parameters();
  optimizer_ = MakeOptimizer(config.optimizer, parameters_);
}

torch::Tensor ReferenceTrainer::ForwardBackward(const Batch& batch) {
  const auto device = config_.device;
  auto context = MakeAttentionContext(config_.model, batch.lengths, batch.time(), config_.dtype, device);
  auto logits = model_->forward(batch.tokens.to(device), context);  // (B, T, vocab)
  auto loss = TokenLossSum(logits, batch.labels.to(device)) / static_cast<double>(batch.valid_tokens);
  loss.backward();
  return loss.detach();
}

StepRecord ReferenceTrainer::Step(int64_t step) {
  auto batch = MakeBatch(config_.data, config_.seed, step);
  for (auto& parameter : parameters_) parameter.mutable_grad().reset();

  // The timed region is the step itself; copying gradients out for comparison is not.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  StepRecord record;
  record.step = step;
  record.tokens = batch.valid_tokens;
  record.loss = ForwardBackward(batch).item<double>();
  record.grad_norm = std::sqrt(GradSquaredSum(parameters_));
  ScaleGradients(parameters_, ClipFactor(record.grad_norm, config_.clip));
  const auto backward_done = Clock::now();
  if (config_.record_gradients) record.gradients = Gradients();
  const auto update_start = Clock::now();
  optimizer_->step();
  const auto end = Clock::now();
  record.step_ms = std::chrono::duration<double, std::milli>((backward_done - start) + (end - update_start)).count();
  return record;
}

TrainResult ReferenceTrainer::Train() {
  TrainResult result;
  for (int64_t step = 0; step < config_.steps; ++step) result.steps.push_back(Step(step));
  result.final_weights = Weights();
  return result;
}

NamedTensors ReferenceTrainer::Weights() const { return DetachedCopies(model_->named_parameters()); }

NamedTensors ReferenceTrainer::Gradients() const {
  NamedTensors gradients;
  for (const auto& item : model_->named_parameters()) {
    if (item.value().grad().defined()) gradients.insert(item.key(), item.value().grad().detach().clone());
  }
  return gradients;
}

}  // namespace pipecheck::reference
