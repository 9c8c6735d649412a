// One rank of the pipeline-parallel trainer: builds this rank's stages (same global names and
// initial values as the reference), then each step interprets this rank's simulator-accepted
// action list, sums the tied weight's gradients between its two owners, clips by the global
// norm over all ranks and applies the optimizer. The executor decides nothing: it only does
// what the list says, and ends each step by checking that nothing is left pending.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/faults.h"
#include "pipeline/rank_result.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "pipeline/stage.h"
#include "pipeline/transport.h"
#include "reference/trainer.h"

namespace pipecheck::pipeline {

// The validated, lowered schedule every rank of this configuration runs.
Schedule BuildSchedule(const PipelineConfig& config);

class PipelineTrainer {
 public:
  PipelineTrainer(const PipelineConfig& config, Transport& transport);
  ~PipelineTrainer();

  // One training step on MakeBatch(seed, step); returns this rank's record of it.
  void Step(int64_t step, RankResult& result);

  // Every step, then the final weights; `after_step(step, result)` runs after each step (progress).
  RankResult Train(const std::function<void(int64_t, const RankResult&)>& after_step = {});

  const Schedule& schedule() const { return schedule_; }

 private:
  struct StepState;

  void Execute(const Action& action, StepState& state);
  void AwaitInput(const Action& action, StepState& state);
  // Fault injection points; each does nothing unless config_.fault names its fault.
  torch::Tensor StaleShapeFault(const torch::Tensor& message, int direction, StepState& state);
  double LossDenominatorFault(const reference::Batch& part, const StepState& state) const;
  void BeforeBackwardFault();
  void AfterBackwardFault();
  void IssueSend(const torch::Tensor& tensor, int peer, Direction direction, int tag, StepState& state);
  void SendFromReusedBuffer(const torch::Tensor& output, int stage, int microbatch, StepState& state);
  void ProcessFault(int64_t step, size_t action_index) const;
  torch::Tensor TakeArrived(int direction, const Action& action, StepState& state);
  void Forward(const Action& action, StepState& state);
  void Backward(const Action& action, StepState& state);
  std::vector<torch::Tensor> OwnedParameters(bool count_tied_copy) const;
  Stage& StageAt(int stage);
  reference::NamedTensors WeightCopies() const;  // detached copies of this rank's parameters
  void RecordWeights(RankResult& result);

  PipelineConfig config_;
  Transport& transport_;
  Schedule schedule_;
  Stages stages_;  // this rank's stages, ascending
  int num_stages_ = 1;
  int64_t baseline_bytes_ = 0;  // live tensor bytes before the trainer existed
  int64_t copies_bytes_ = 0;    // bytes of gradient and weight copies handed out so far
  std::unique_ptr<reference::GradientAccumulator> accumulator_;  // over OwnedParameters(true)
};

}  // namespace pipecheck::pipeline
