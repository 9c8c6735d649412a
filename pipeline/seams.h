// The seams of a step's correct path, where something else may be put in: the tensors passed
// between a stage's actions (TensorSeams), the executor's events (ExecutionObserver), the
// executor's messages (a transport wrapper) and the step's gradient path (gradient_path.h). The
// executor and the trainer run through a Seams bundle and never branch on what fills it: the
// correct pipeline's changes nothing, and an injected fault (faults.h) fills it with its own.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pipeline/gradient_path.h"
#include "pipeline/transport.h"
#include "reference/gradient_accumulation.h"
#include "reference/layers.h"

namespace pipecheck::pipeline {

struct PipelineConfig;

// What a rank's loss terms are divided by: the tokens of a microbatch, of its replica's
// microbatches, and of the whole global batch, and how many replicas share that batch.
struct LossTokens {
  int64_t microbatch = 0;
  int64_t replica = 0;
  int64_t batch = 0;
  int replicas = 1;
  // loss microbatch_mean: the microbatches each replica's step averages (every round's); 0 under
  // loss tokens.
  int64_t mean_over = 0;
};

// Where a stage's balance-loss terms (mixture of experts) were made.
struct BalanceTermsAt {
  int stage = 0;
  int microbatch = 0;
  bool last_stage = false;
  int64_t microbatch_sequences = 0;
  int64_t step_sequences = 0;  // the whole step's, every replica's: the terms' 1/B
};

// The tensors a stage's actions hand each other, each as the correct pipeline has it (the one it
// was given, the right denominator, its own labels).
class TensorSeams {
 public:
  virtual ~TensorSeams() = default;
  // The activation a stage takes from another rank, already a leaf that requires its gradient.
  virtual torch::Tensor ReceivedInput(const torch::Tensor& input) const { return input; }
  // The denominator of a microbatch's loss term: the whole global batch's tokens, so the sum of
  // the replicas' gradients is the whole batch's gradient; under microbatch_mean its own tokens
  // times every microbatch of the step (each replica's, times the replicas). The same scale as
  // the single-device reference's: a reduced-precision backward then rounds as the reference's
  // does, where a replica's share (tokens / replicas) scaled by a non-power of two rounds
  // otherwise (bfloat16, three replicas: 9e-3 against the reference's float32 sums).
  virtual double LossDenominator(const LossTokens& tokens) const {
    if (tokens.mean_over > 0) {
      return static_cast<double>(tokens.microbatch) * static_cast<double>(tokens.mean_over) * tokens.replicas;
    }
    return static_cast<double>(tokens.batch);
  }
  // The tensor a stage takes as its received input of `microbatch`: the received leaf itself.
  virtual torch::Tensor ReceiveBuffer(int /*stage*/, int /*microbatch*/, const torch::Tensor& input) { return input; }
  // Whose labels the loss of `microbatch` is computed with: its own.
  virtual int LabelsOf(int microbatch) const { return microbatch; }
  // The input a stage keeps for its backward to recompute its forward from (recompute=1).
  virtual torch::Tensor KeptForRecompute(int /*stage*/, const torch::Tensor& input) { return input; }
  // The gradient a backward of `microbatch` starts from (ones for the loss, else the output's).
  virtual torch::Tensor BackwardSeed(const torch::Tensor& gradient, int /*microbatch*/) const { return gradient; }
  // The input gradient a backward hands back (undefined where its input had no graph).
  virtual torch::Tensor InputGradient(const torch::Tensor& gradient, const torch::Tensor& /*input*/) const {
    return gradient;
  }
  // Stage `stage`'s input gradient of `microbatch` as a backward makes it, and as it is later
  // sent or handed over: the one made for that microbatch.
  virtual void InputGradientMade(int /*stage*/, int /*microbatch*/, const torch::Tensor& /*gradient*/) {}
  virtual torch::Tensor InputGradientTaken(int /*stage*/, int /*microbatch*/, const torch::Tensor& gradient) {
    return gradient;
  }
  // After a backward: its reduced-precision gradients move into the float32 sums (else they add
  // up in the parameter's dtype, as autograd's own accumulation does).
  virtual void SumAfterBackward(reference::GradientAccumulator& accumulator) { accumulator.AfterBackward(); }
  // Mixture of experts. The forward context a stage's MoE layers route and count with: as made
  // (the router in RouterDtype, the balance statistics over each sequence's own positions).
  virtual void MoeContext(reference::AttentionContext& /*context*/) const {}
  // A forward's routing counts (by layer) into the step's: each microbatch counted once, by its
  // forward, not again by a recomputation of it (recompute=1).
  virtual void CountRouting(bool recomputed, const std::map<int64_t, torch::Tensor>& counts,
                            std::map<int64_t, torch::Tensor>& step_counts) const {
    if (recomputed) return;
    for (const auto& [layer, layer_counts] : counts) {
      auto& sum = step_counts[layer];
      sum = sum.defined() ? sum + layer_counts : layer_counts;
    }
  }
  // Whether the step's counts are summed over the replicas before they move the expert biases.
  virtual bool CountsSummedOverReplicas() const { return true; }
  // Whether the expert biases move once this rank's last forward has counted, before its backwards
  // and the optimizer step, instead of after the step (a recomputed forward would then route with
  // the moved bias).
  virtual bool BiasMovedAfterForwards() const { return false; }
  // A stage's balance-loss terms of a microbatch, as they enter its backward and the step's
  // reported loss: its own MoE layers' (undefined where it has none).
  virtual torch::Tensor BalanceTerms(const BalanceTermsAt& /*at*/, const torch::Tensor& terms) const { return terms; }
  // The balance loss the head's rank adds to the step's reported loss: the total over every
  // stage and replica, whether or not the rank's own stages hold an MoE layer.
  virtual double ReportedBalanceLoss(double total, bool /*own_moe_layers*/) const { return total; }
  // Around a W of `module`: what the first returns is handed to the second.
  virtual torch::Tensor BeforeWeightGradient(const torch::nn::Module& /*module*/) const { return {}; }
  virtual void AfterWeightGradient(const torch::nn::Module& /*module*/, const torch::Tensor& /*before*/) const {}
  // Checkpoints at a resume (checkpoint.h), as the correct trainer writes and loads them.
  // Whether the rank holding stage `stage` of replica 0 writes the stage's file.
  virtual bool WritesStageFile(int /*stage*/, int /*stages*/) const { return true; }
  // Whether rank 0 commits (and a loader accepts) only a checkpoint holding every file its layout
  // writes; otherwise what is there is committed and loaded, the rest left as it was.
  virtual bool RequiresCompleteCheckpoint() const { return true; }
  // Whether AdamW's step count is loaded (else it restarts at 0, and its bias correction with it).
  virtual bool RestoresAdamStep() const { return true; }
  // Whether a parameter's moments are found under its name (else by its position among the
  // parameters of the saved stage that had this stage's index, as a positional state dict maps them).
  virtual bool MomentsByName() const { return true; }
  // Whether the last stage's copy of a tied weight is loaded (else it keeps its initial values).
  virtual bool RestoresTiedHeadCopy() const { return true; }
  // Whether the data position is loaded (else the run starts again at the first batch).
  virtual bool RestoresDataPosition() const { return true; }
  // The replica whose saved data position replica `replica` of `replicas` loads, where the replica
  // count is the checkpoint's.
  virtual int DataReplicaToLoad(int replica, int /*replicas*/) const { return replica; }
};

// The executor's events, in the order a step meets them; the correct pipeline does nothing at any.
class ExecutionObserver {
 public:
  virtual ~ExecutionObserver() = default;
  virtual void BeginStep() {}
  // Before action `index` of the `actions` this rank runs in `step`.
  virtual void BeforeAction(int64_t /*step*/, size_t /*index*/, size_t /*actions*/) const {}
  // Before stage `stage` runs its forward over `input` (tokens (b, t) or activations (b, t, h)),
  // `parameters` being the stage's own.
  virtual void BeforeForward(int /*stage*/, const torch::Tensor& /*input*/,
                             const std::vector<torch::Tensor>& /*parameters*/) {}
  // Around every backward that accumulates into `parameters` (a B, or a W).
  virtual void BeforeBackward(const std::vector<torch::Tensor>& /*parameters*/) {}
  virtual void AfterBackward(const std::vector<torch::Tensor>& /*parameters*/) {}
  // After this rank's last backward (B or W) of accumulation round `round` (every step has at
  // least one round): the rounds' gradients simply add up, so nothing happens here.
  virtual void AfterRound(int /*round*/, const std::vector<torch::Tensor>& /*parameters*/) {}
};

// One rank's seams for a run, as SeamsFor (faults.h) builds them.
struct Seams {
  std::shared_ptr<void> owner;  // keeps what `tensors` and `observer` point into
  TensorSeams* tensors = nullptr;
  ExecutionObserver* observer = nullptr;
  // The executor's transport: its sends and receives through this wrapper to the given one.
  std::function<std::unique_ptr<Transport>(Transport&)> wrap_messages;
  GradientPath gradient_path = CorrectGradientPath();
  bool post_receives_first = true;  // the lowering posts receives ahead of the sends due with them
  bool correct = true;              // nothing injected (timing-only steps are only for such runs)
};

}  // namespace pipecheck::pipeline
