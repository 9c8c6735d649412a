// The reference runs a scenario's verdict is drawn from, all on one device:
//  - at the pipeline's weights: for every step k, the reference's loss and gradients of batch k
//    at exactly the weights the pipeline started step k with, and the weights one optimizer step
//    gives from there with the gradients the pipeline applied. Errors then measure only step k's
//    arithmetic and stay at rounding level however long the run;
//  - free-running: the reference trained from the initial weights on its own, the trajectory
//    the pipeline's losses and final weights should follow;
//  - the rounding envelope, computed only when asked for: the free-running reference again, but
//    accumulating over the scenario's microbatches in the pipeline's order, which measures how
//    far legitimate rounding differences move a trajectory by step k.
// Not a judge: it produces numbers; parity.h decides.
#pragma once

#include <memory>
#include <optional>

#include "reference/trainer.h"

namespace pipecheck::harness {

class Oracle {
 public:
  // `microbatches` is the pipeline's count, used by the envelope run only.
  Oracle(reference::TrainConfig config, int64_t microbatches);

  // The initial weights every trainer must start from.
  const reference::NamedTensors& InitialWeights() const;
  // The expert biases (expert_bias > 0) every trainer starts from: zeros; empty without.
  const reference::NamedTensors& InitialExpertBiases() const;

  // The configuration every reference run starts from (boundary_layers: what EvaluateAt taps).
  const reference::TrainConfig& config() const { return config_; }

  // Loss and (clipped) gradients of step k's batch at `weights`, and the hidden states (with
  // their gradients) entering config().boundary_layers, routing with the expert biases `biases`
  // (the pipeline's at the step's start; empty without expert_bias) and giving way to `routing`
  // (the pipeline's choices) where a token's choice is decided within its tolerance; the record's
  // expert_biases are where the step's counts move them. Call for k = 0, 1, ... in order.
  reference::StepRecord EvaluateAt(const reference::NamedTensors& weights, const reference::NamedTensors& biases,
                                   const reference::RoutingSuggestion& routing, int64_t step);

  // Gradients of step k's batch at `weights` as a correct pipeline sums them: the pipeline's
  // microbatches one after another, each gradient added into a float32 sum where the parameters
  // are reduced-precision (GradientAccumulator), clipped by the summed gradients' global norm.
  // Against these a pipeline's own arithmetic differs by rounding of float32 sums only, where the
  // whole batch's gradients differ by bfloat16's rounding. Call for k = 0, 1, ... in order.
  reference::StepRecord EvaluateAccumulatedAt(const reference::NamedTensors& weights,
                                              const reference::NamedTensors& biases,
                                              const reference::RoutingSuggestion& routing, int64_t step);

  // Weights after one optimizer step from `weights` applying `gradients`. Optimizer state
  // carries over between calls, so call once per step in order.
  reference::NamedTensors UpdateFrom(const reference::NamedTensors& weights, const reference::NamedTensors& gradients);
  // The same in float32, from float32 master weights: a trainer that steps float32 copies of
  // lower-precision parameters (its own optimizer state, kept from call to call).
  reference::NamedTensors UpdateMasterFrom(const reference::NamedTensors& master,
                                           const reference::NamedTensors& gradients);

  // UpdateFrom's optimizer state by parameter name (ReferenceTrainer::OptimizerState), and set
  // back: a judge that takes over a run resumed at step k carries on from the state the previous
  // judge's updater reached at step k.
  reference::NamedTensors UpdaterState() const { return updater_->OptimizerState(); }
  void SetUpdaterState(const reference::NamedTensors& state) { updater_->SetOptimizerState(state); }

  // The free-running reference (computed on first call; timed and metered).
  const reference::TrainResult& FreeRunning();

  // The microbatched free-running reference (computed on first call).
  const reference::TrainResult& Envelope();

 private:
  reference::TrainConfig config_;
  int64_t microbatches_;
  std::unique_ptr<reference::ReferenceTrainer> evaluator_;  // weights set from outside each step
  std::unique_ptr<reference::ReferenceTrainer> updater_;    // owns the optimizer state of UpdateFrom
  std::unique_ptr<reference::ReferenceTrainer> master_updater_;  // UpdateMasterFrom's, in float32
  std::unique_ptr<reference::ReferenceTrainer> accumulating_;  // the pipeline's microbatches (made on first use)
  reference::NamedTensors initial_weights_;
  reference::NamedTensors initial_biases_;
  std::optional<reference::TrainResult> free_running_, envelope_;
};

}  // namespace pipecheck::harness
