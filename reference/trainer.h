// The oracle: the whole model on one device, the whole batch in one forward and backward,
// optional global-norm clipping, then SGD or AdamW, for N steps. Everything pipecheck
// concludes is measured against what this produces.
// Not fast on purpose, and never includes pipeline/.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "reference/data.h"
#include "reference/gradient_accumulation.h"
#include "reference/memory_meter.h"
#include "reference/model.h"
#include "reference/model_config.h"
#include "reference/optimizer.h"

namespace pipecheck::reference {


struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  uint64_t seed = 1234;
  int64_t steps = 2;
  double clip = 0.0;  // global-norm clipping threshold; 0 = off
  torch::Dtype dtype = torch::kFloat64;
  torch::Device device = torch::kCPU;
  bool record_gradients = true;  // keep every step's (clipped) gradients
  // 1: the whole batch in one forward and backward (the oracle). m > 1: the batch's m
  // microbatches one after another with gradients accumulated, the arithmetic a pipeline does;
  // used to measure how far rounding alone moves a free-running trajectory.
  int64_t microbatches = 1;
  // Loss normalisation. 0: the step's summed token cross entropy over its labelled tokens. M > 0
  // (microbatch_mean): the batch cut into M contiguous microbatches (MicrobatchSizes), each one's
  // summed cross entropy over its own labelled tokens, averaged over the M.
  int64_t loss_microbatches = 0;
  // Layers whose incoming hidden state (and its gradient) each whole-batch step keeps in
  // StepRecord::boundaries: a pipeline's stage boundaries, for fingerprint comparisons.
  std::vector<int64_t> boundary_layers;
  // On a CUDA device: a step's forward and backward work must only queue on the device, never
  // make the host wait for it (HostSyncCheck: such a wait throws). Off in real runs; tests turn
  // it on to prove the trainers keep the host ahead of the GPU. No effect on the CPU.
  bool check_host_syncs = false;
  // Each step's time split by phase (StepRecord::phase_ms), the device synchronised at every
  // phase's end so that a phase holds its own device work. Slower than an unsplit step; for
  // finding where a step's time goes (`pipecheck reference --phases`). Excludes check_host_syncs.
  bool phase_times = false;
};

// Where a step's time went, phase by phase in the order first seen: (phase, ms). A phase met
// several times in a step (once per microbatch) holds the sum.
using PhaseTimes = std::vector<std::pair<std::string, double>>;

// The clock behind TrainConfig::phase_times: Start() at a step's start, Mark(phase) at the end of
// each phase (the device synchronised first). Does nothing when off.
class PhaseClock {
 public:
  PhaseClock(bool on, torch::Device device) : on_(on), device_(device) {}
  void Start();
  void Mark(const std::string& phase);
  PhaseTimes Take();  // this step's phases; the clock is empty again

 private:
  bool on_;
  torch::Device device_;
  std::chrono::steady_clock::time_point last_;
  PhaseTimes times_;
};

// The hidden state entering one layer over the whole batch, and the loss's gradient there.
struct BoundaryTensors {
  torch::Tensor activation;  // (B, T, hidden)
  torch::Tensor gradient;    // (B, T, hidden); undefined if none reached it
};

// Routing within rounding: by layer, the (B, T, k) int64 choices another run of the step's whole
// batch made (-1 where it reported none), and the tolerance within which a token's own choice
// gives way to it (AttentionContext::suggested_routing).
struct RoutingSuggestion {
  std::map<int64_t, torch::Tensor> choices;
  double tolerance = 0.0;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;       // the whole objective: cross entropy plus the balance loss
  double aux_loss = 0.0;   // the balance loss alone (mixture of experts; 0 without)
  double grad_norm = 0.0;  // global norm before clipping
  double step_ms = 0.0;    // forward + backward + clip + optimizer step
  int64_t tokens = 0;      // labelled tokens of the batch
  int64_t peak_bytes = -1; // tensor bytes the trainer held at most during the step; -1 unmetered
  NamedTensors gradients;  // the gradients the optimizer applied (empty unless recorded)
  std::map<int64_t, BoundaryTensors> boundaries;  // by layer (TrainConfig::boundary_layers)
  // Mixture of experts: tokens routed to each expert over the step's whole batch (E, int64;
  // padding excluded), by global layer index. With expert_bias, each MoE layer's bias as this
  // step leaves it (moved by these counts; Evaluate computes it without applying it).
  std::map<int64_t, torch::Tensor> expert_counts;
  NamedTensors expert_biases;
  // Against a RoutingSuggestion: token choices taken from it (within rounding), choices that
  // differed beyond it, and the first of those described.
  int64_t routing_adopted = 0;
  int64_t routing_beyond = 0;
  std::string routing_first_beyond;
  PhaseTimes phase_ms;     // TrainConfig::phase_times only
};

struct TrainResult {
  std::vector<StepRecord> steps;
  NamedTensors final_weights;
  NamedTensors final_expert_biases;  // expert_bias > 0: after the last step

  // Median step time, leaving out step 0 (warm-up) when there is more than one step.
  double MedianStepMs() const;
  // Median over the same steps of labelled tokens / step time.
  double MedianTokensPerSecond() const;
  // Largest step peak of tensor bytes; -1 when the memory meter was off.
  int64_t PeakBytes() const;
  // Each phase's median over the same steps (TrainConfig::phase_times), in the order first seen.
  PhaseTimes MedianPhaseMs() const;
};

class ReferenceTrainer {
 public:
  explicit ReferenceTrainer(const TrainConfig& config);

  // Forward and backward of `batch` in one piece; gradients are accumulated into the
  // parameters. Returns the loss summed over tokens and divided by `normalising_tokens` (the
  // batch's own labelled tokens by default; a microbatch's share of a whole batch's loss is
  // divided by the whole batch's), 0-dim, detached.
  torch::Tensor ForwardBackward(const Batch& batch);
  torch::Tensor ForwardBackward(const Batch& batch, int64_t normalising_tokens);
  // microbatch_mean: each sequence's summed cross entropy times its own weight (B,), float64.
  torch::Tensor ForwardBackward(const Batch& batch, const torch::Tensor& sequence_weights);

  // One training step on MakeBatch(seed, step).
  StepRecord Step(int64_t step);

  // Loss and gradients of MakeBatch(seed, step) at the current weights, clipped as a step
  // would clip them, without the optimizer: what a step applies. Gradients always recorded.
  StepRecord Evaluate(int64_t step);

  // Overwrites every parameter with `weights` (same names; extra names are an error).
  void SetWeights(const NamedTensors& weights);

  // One optimizer step that applies `gradients` (by name, as given: already clipped).
  void ApplyGradients(const NamedTensors& gradients);

  // `steps` steps from the initial weights.
  TrainResult Train();

  // The balance loss (mixture of experts) the forwards since the step began added to their loss:
  // 0-dim float64, undefined where the model has none.
  const torch::Tensor& AuxLossSum() const { return aux_sum_; }

  // The routing the next steps' forwards give way to within its tolerance (empty: none).
  void SetRoutingSuggestion(RoutingSuggestion suggestion) { suggestion_ = std::move(suggestion); }

  // The expert biases (expert_bias > 0) the next forward routes with, as copies, and set by name.
  NamedTensors ExpertBiases() const { return reference::ExpertBiases(*model_); }
  void SetExpertBiases(const NamedTensors& biases) { reference::SetExpertBiases(*model_, biases); }
  // The expert biases as the routing counts of the forwards since the step began (since the
  // trainer was made, before any step) move them; empty without expert_bias.
  NamedTensors MovedExpertBiases() const;

  NamedTensors Weights() const;    // detached copies
  NamedTensors Gradients() const;  // detached copies; undefined gradients are skipped
  // The optimizer's state by parameter name, as a checkpoint keys it ("exp_avg/NAME",
  // "exp_avg_sq/NAME", "step/NAME"; nothing for a parameter without state), and set back from it.
  NamedTensors OptimizerState() const;
  void SetOptimizerState(const NamedTensors& state);
  TransformerSlice& model() { return model_; }

 private:
  // A step's values still on the device, read by Settle once the step's work is queued, so that
  // a GPU step does not wait for its loss and norm mid-step (the host stays ahead of the device,
  // as a PyTorch user's step does). On the CPU nothing runs ahead of the host: read at once.
  struct PendingReads {
    torch::Tensor loss;     // 0-dim
    torch::Tensor aux;      // 0-dim float64, the balance loss's part of `loss`; undefined if none
    torch::Tensor squares;  // GradSquares, when the norm is not needed before the optimizer
  };
  // Gradients of `step`'s batch into the parameters, clipped; fills tokens, and loss and
  // grad_norm or what `pending` will read them from.
  StepRecord ComputeGradients(int64_t step, PendingReads& pending);
  // Forward, the loss `loss_of` makes of the logits and the labels on the device, backward; each
  // public ForwardBackward is this with its own loss.
  using LossOf = std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& labels)>;
  torch::Tensor ForwardBackward(const Batch& batch, const LossOf& loss_of);
  static void Settle(StepRecord& record, PendingReads& pending);

  TrainConfig config_;
  TransformerSlice model_{nullptr};
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<GradientAccumulator> accumulator_;
  int64_t baseline_bytes_ = 0;  // tensor bytes held on its device before the trainer existed
  // The step being computed: its batch's sequences (the balance loss's 1/B) and the balance
  // loss its forwards have added so far (0-dim float64; undefined before any).
  int64_t step_sequences_ = 0;
  torch::Tensor aux_sum_;
  std::map<int64_t, torch::Tensor> counts_;  // routing counts its forwards made so far, by layer
  RoutingSuggestion suggestion_;
  int64_t part_first_ = 0;  // the first sequence of the (micro)batch being run, in the step's batch
  int64_t adopted_ = 0, beyond_ = 0;  // against suggestion_, this step so far
  std::string first_beyond_;
  PhaseClock phases_;
};

// microbatch_mean's weight of each sequence's summed cross entropy (B,), float64: 1 / (its
// microbatch's labelled tokens x microbatches), the batch cut as MicrobatchSizes cuts it.
torch::Tensor MicrobatchMeanWeights(const Batch& batch, int64_t microbatches);

// The first step that counts for speed: step 1 when there are several (step 0 warms up), else 0.
size_t FirstTimedStep(size_t steps);

// Median of `values`; NaN when there are none.
double Median(std::vector<double> values);

}  // namespace pipecheck::reference
