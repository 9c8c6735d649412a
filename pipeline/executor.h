// The pipeline executor: interprets one rank's simulator-accepted action list for one step,
// one small function per action kind (as PyTorch's pipelining runtime does), and decides
// nothing itself. Communication follows the discipline docs/design.md §4 states and the simulator
// checks: receives are posted where the plan puts them, payload included (the plan knows every
// message's shape), so data lands while the rank computes; messages to one peer in one direction
// leave in order, and a send's buffer is released as soon as that send has completed, at the
// latest when the next message to the same peer and direction goes. A rank blocks only where
// the simulator says it may: on a compute action's input, and on a send whose predecessor has
// not yet left (the transport discipline, transport.h). A backward is whole (B) or split (I then
// W, zero-bubble schedules): I computes only the input's gradient and keeps the graph, W then
// computes the parameters'. A step ends by proving nothing is left pending, every I's W included.
//
// Not the trainer: gradients are accumulated here, but tied sums, clipping and the optimizer
// step are the trainer's (trainer.h).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <map>

#include <vector>

#include "pipeline/flight_recorder.h"
#include "pipeline/message.h"
#include "pipeline/rank_result.h"
#include "pipeline/schedule.h"
#include "pipeline/seams.h"
#include "pipeline/stage.h"
#include "pipeline/transport.h"
#include "reference/data.h"
#include "reference/device.h"
#include "reference/gradient_accumulation.h"
#include "reference/memory_meter.h"

namespace pipecheck::pipeline {

class Executor {
 public:
  // Everything is borrowed and must outlive the executor: its messages go through `transport`,
  // the tensors between its actions through `tensors`, and `observer` hears its events.
  Executor(const PipelineConfig& config, const Schedule& schedule, Stages& stages, Transport& transport,
           TensorSeams& tensors, ExecutionObserver& observer, reference::GradientAccumulator& accumulator);
  ~Executor();

  // Runs this rank's actions for `step` on `batch`, appending each action's timing (and the
  // bytes `window` says the trainer holds after it) to `timeline`, and the fingerprint of every
  // tensor it sent, received or handed over across a stage boundary to `boundaries`. Returns
  // the step's loss as a 0-dim float64 tensor on the device, read by nobody here (undefined
  // without the head).
  torch::Tensor Run(int64_t step, const reference::Batch& batch, reference::StepWindow& window,
                    std::vector<ActionTiming>& timeline, std::vector<BoundaryRecord>& boundaries);

  // Where the run's clock starts: each step's start (ActionTiming::step_start_us) is timed from
  // `origin`. PipelineTrainer::Train puts every rank on one clock with it.
  void SetClockOrigin(std::chrono::steady_clock::time_point origin) { clock_origin_ = origin; }
  double HostMicroseconds() const;  // now, on the run's clock

  // Each action's start and end also go to `recorder` as they happen (borrowed; null: none).
  void SetFlightRecorder(FlightRecorder* recorder) { recorder_ = recorder; }

  // The balance loss (mixture of experts) this rank's stages added in the last Run: 0-dim float64
  // on the device, undefined where none of its stages has an MoE layer.
  const torch::Tensor& LastAuxSum() const { return last_aux_sum_; }
  // The routing counts (mixture of experts) of the last Run, by global layer index: tokens each
  // expert of this rank's MoE layers was routed over the replica's microbatches (E, int64,
  // padding excluded), each microbatch counted once, by its forward (CountRouting).
  const std::map<int64_t, torch::Tensor>& LastExpertCounts() const { return last_expert_counts_; }
  // Called once a step, after this rank's last forward, with the counts made so far.
  using CountsHook = std::function<void(const std::map<int64_t, torch::Tensor>&)>;
  // The routing of the last Run (mixture of experts): each microbatch's choices (its sequences ×
  // its padded length, k) int64 by (global layer, microbatch), as its forward dispatched them.
  const std::map<std::pair<int64_t, int>, torch::Tensor>& LastRouting() const { return last_routing_; }
  void SetAfterForwards(CountsHook hook) { after_forwards_ = std::move(hook); }

  // Called after every backward that accumulates into the parameters (a B or a W), with it.
  void SetAfterBackward(std::function<void(const Action&)> hook) { after_backward_ = std::move(hook); }

 private:
  struct StepState;

  // One function per action kind.
  void Forward(const Action& action, StepState& state);
  void Backward(const Action& action, StepState& state);
  void BackwardInput(const Action& action, StepState& state);   // I: the input's gradient, graph kept
  void BackwardWeight(const Action& action, StepState& state);  // W: the parameters' gradients
  // After a B or a W has added into the parameters' gradients: the observer's AfterBackward, the
  // float32 sums of reduced-precision gradients, the trainer's hook.
  void AfterParameterGradients(const Action& action);
  void Receive(const Action& action, StepState& state);  // RECV_F and RECV_B alike
  void SendForward(const Action& action, StepState& state);
  void SendBackward(const Action& action, StepState& state);

  void Dispatch(const Action& action, StepState& state);
  // One action of this rank's list, its wait (for its input), start and end marked on the
  // device's clock.
  struct ActionMarks {
    int wait = 0, start = 0, end = 0;
  };
  ActionMarks RunAction(size_t index, StepState& state);
  // Every send completed, the received headers checked, the fingerprints read, and nothing left
  // pending.
  void EndStep(StepState& state, std::vector<BoundaryRecord>& boundaries);
  // Completes the receive a compute action consumes, before it is timed.
  void AwaitInput(const Action& action, StepState& state);
  // The received message compute action `action` takes as its input.
  torch::Tensor TakeArrived(const Action& action, StepState& state);
  MessageShape PlannedMessage(int microbatch, const StepState& state) const;
  // Where a backward of (s, mb) starts: the loss, or the output with its gradient (received or
  // handed over); `passthrough` when the stage has no layers (its output is its input).
  // `aux`: a stage's balance-loss terms (mixture of experts) outside the head's stage, a second
  // root whose gradient is 1 (the head's stage adds its own into the loss term); undefined if none.
  struct BackwardRoot {
    torch::Tensor root, gradient, aux;
    bool passthrough = false;
  };
  BackwardRoot TakeBackwardRoot(const Action& action, StepState& state);
  // Stage `stage`'s forward of `microbatch` on `input`: its output, or for the head's stage the
  // microbatch's loss term (LossOf); `aux`, where given, gets the sum of its MoE layers'
  // balance-loss terms for this microbatch (undefined where it has none).
  // `moe`, where given, gets what its MoE layers recorded (routing counts and choices).
  torch::Tensor StageForward(Stage& stage, int microbatch, const torch::Tensor& input, const StepState& state,
                             torch::Tensor* aux = nullptr, reference::MoeRecord* moe = nullptr) const;
  // A microbatch's loss term from the head's output.
  torch::Tensor LossOf(const torch::Tensor& output, int microbatch, const StepState& state) const;
  // recompute=1: stage s's forward of microbatch mb again, from its kept input (a fresh leaf, put
  // back in its place), with the graph the backward needs; the loss term for the head's stage.
  torch::Tensor Recompute(int s, int mb, StepState& state, torch::Tensor* aux);
  // The input gradient a stage hands back, as the InputGradient seam leaves it.
  void KeepInputGradient(const Action& action, torch::Tensor gradient, const torch::Tensor& input, StepState& state);
  // Sends `tensor` as `message` (fingerprinted first) once the previous message to the same peer
  // and direction has left.
  void IssueSend(const torch::Tensor& tensor, const Message& message, StepState& state);
  // Fingerprints a boundary tensor as it is now (the numbers are read once, at the step's end).
  void Probe(const torch::Tensor& tensor, Direction direction, int stage, int microbatch, BoundaryRole role, int peer,
             StepState& state);
  bool OnThisRank(int stage) const;
  void ReadProbes(StepState& state, std::vector<BoundaryRecord>& boundaries);

  std::chrono::steady_clock::time_point clock_origin_ = std::chrono::steady_clock::now();
  const PipelineConfig& config_;
  const Schedule& schedule_;
  Stages& stages_;
  Transport& transport_;
  TensorSeams& tensors_;
  ExecutionObserver& observer_;
  reference::GradientAccumulator& accumulator_;
  reference::DeviceClock clock_;  // action timings, on the device's own clock
  std::vector<torch::Tensor> owned_parameters_;  // with the tied copy: what backward accumulates into
  // Accumulation rounds: the index of this rank's last action of each round that accumulates into
  // the parameters (a B or a W), with its round; the observer's AfterRound runs after it.
  std::map<size_t, int> round_ends_;
  FlightRecorder* recorder_ = nullptr;
  torch::Tensor last_aux_sum_;
  std::map<int64_t, torch::Tensor> last_expert_counts_;
  std::map<std::pair<int64_t, int>, torch::Tensor> last_routing_;
  size_t last_forward_ = SIZE_MAX;  // index of this rank's last forward action
  CountsHook after_forwards_;
  std::function<void(const Action&)> after_backward_;
};

}  // namespace pipecheck::pipeline
