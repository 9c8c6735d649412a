// Reference runs for the parity judges (see oracle.h).
#include "harness/oracle.h"

namespace pipecheck::harness {

Oracle::Oracle(reference::TrainConfig config, int64_t microbatches)
    : config_(std::move(config)), microbatches_(microbatches) {
  config_.record_gradients = true;
  config_.microbatches = 1;
  evaluator_ = std::make_unique<reference::ReferenceTrainer>(config_);
  auto updater_config = config_;
  updater_config.boundary_layers.clear();
  updater_ = std::make_unique<reference::ReferenceTrainer>(updater_config);
  initial_weights_ = evaluator_->Weights();  // before any SetWeights
  initial_biases_ = evaluator_->ExpertBiases();
}

const reference::NamedTensors& Oracle::InitialWeights() const { return initial_weights_; }
const reference::NamedTensors& Oracle::InitialExpertBiases() const { return initial_biases_; }

reference::StepRecord Oracle::EvaluateAt(const reference::NamedTensors& weights, const reference::NamedTensors& biases,
                                         const reference::RoutingSuggestion& routing, int64_t step) {
  evaluator_->SetWeights(weights);
  evaluator_->SetExpertBiases(biases);
  evaluator_->SetRoutingSuggestion(routing);
  return evaluator_->Evaluate(step);
}

reference::StepRecord Oracle::EvaluateAccumulatedAt(const reference::NamedTensors& weights,
                                                    const reference::NamedTensors& biases,
                                                    const reference::RoutingSuggestion& routing, int64_t step) {
  if (!accumulating_) {
    auto config = config_;
    config.microbatches = microbatches_;
    config.boundary_layers.clear();
    accumulating_ = std::make_unique<reference::ReferenceTrainer>(config);
  }
  accumulating_->SetWeights(weights);
  accumulating_->SetExpertBiases(biases);
  accumulating_->SetRoutingSuggestion(routing);
  return accumulating_->Evaluate(step);
}

reference::NamedTensors Oracle::UpdateFrom(const reference::NamedTensors& weights,
                                           const reference::NamedTensors& gradients) {
  updater_->SetWeights(weights);
  updater_->ApplyGradients(gradients);
  return updater_->Weights();
}

reference::NamedTensors Oracle::UpdateMasterFrom(const reference::NamedTensors& master,
                                                 const reference::NamedTensors& gradients) {
  if (!master_updater_) {
    auto config = config_;
    config.dtype = torch::kFloat32;
    config.boundary_layers.clear();
    master_updater_ = std::make_unique<reference::ReferenceTrainer>(config);
  }
  master_updater_->SetWeights(master);
  master_updater_->ApplyGradients(gradients);
  return master_updater_->Weights();
}

const reference::TrainResult& Oracle::FreeRunning() {
  if (!free_running_) {
    auto config = config_;
    config.record_gradients = false;  // gradients are judged at the pipeline's weights instead
    config.boundary_layers.clear();   // and boundaries too
    free_running_ = reference::ReferenceTrainer(config).Train();
  }
  return *free_running_;
}

const reference::TrainResult& Oracle::Envelope() {
  if (!envelope_) {
    auto config = config_;
    config.microbatches = microbatches_;
    config.record_gradients = false;
    config.boundary_layers.clear();
    envelope_ = reference::ReferenceTrainer(config).Train();
  }
  return *envelope_;
}

}  // namespace pipecheck::harness
