// Named deviations from a correct pipeline, each modelled on a bug real pipeline trainers
// shipped. They are compiled in so pipecheck can prove it catches them, and inert unless a
// scenario's `fault` column names one. Not a fuzzer: each fault is one precise, known bug.
//
// Every fault lives in this one object: the executor and the trainer call its hooks at fixed
// points and each hook does nothing unless its fault is the one injected, so the correct code
// path reads without any fault in it.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/transport.h"

namespace pipecheck::pipeline {

enum class Fault {
  kNone,
  kDetachInput,             // a stage's received activation is detached before use
  kMeanOfMicrobatchMeans,   // each microbatch's loss divided by its own tokens, then by m
  kGradScalePerMicrobatch,  // accumulated gradients divided by m after every microbatch
  kZeroGradPerMicrobatch,   // gradients zeroed before each microbatch's backward
  kDropMicrobatch,          // the last microbatch's backward skipped (zeros sent on)
  kLocalClip,               // each rank clips by its own norm
  kTiedNormTwice,           // the tied weight counted on both owners in the global norm
  kSkipTiedSync,            // tied gradients not summed between their owners
  kStaleShape,              // receive buffers sized from the first microbatch, reused
  kOptimizerStateReset,     // the optimizer rebuilt at every step
  kSendBeforeRecv,          // blocking sends issued before the matching receives are posted
  kCrashRank,               // the last rank aborts in the middle of step 1 (0 if only one step)
  kHangRank,                // the last rank stops making progress in the middle of step 1 (likewise)
  kClipBeforeTiedSync,      // the clipping norm computed before the tied gradients are summed
  kDoubleGradScaling,       // gradients divided by m at step end on top of the whole-batch normalisation
  kSendBufferReuse,         // an activation's send buffer overwritten before its send completed
  kZbSharedWeightGradTwice, // a split backward's W adds the tied embedding's gradient twice (PyTorch #180952)
  kSwapBoundaryShapes,      // a boundary message's header states the other direction's last shape (Megatron MCORE-382)
  kDuplicateSend,           // every activation sent twice, the copy drained by its receiver (a retry that re-sends)
  kReversedAccumulation,    // rank 0 holds each microbatch's gradients apart and sums them newest first
  kSlowSteps,               // every rank busy a quarter longer each step: tokens/s down 20% or more
  kKilledRank,              // the last rank gets SIGKILL in the middle of step 1, as from the kernel's OOM killer
};

// Names as the scenario column spells them, "none" first, in enum order. The only list.
const std::vector<std::string>& FaultNames();

// Throws std::invalid_argument for unknown names.
Fault ParseFault(const std::string& name);

// The injected fault and its hooks. A default-constructed Faults injects nothing.
class Faults {
 public:
  explicit Faults(Fault fault = Fault::kNone, int microbatches = 1, int rank = 0)
      : fault_(fault), microbatches_(microbatches), rank_(rank) {}

  // send_before_recv: the lowering pass leaves sends ahead of the receives due with them.
  bool PostReceivesFirst() const { return fault_ != Fault::kSendBeforeRecv; }
  // detach_input: a received activation is used without requires_grad.
  bool KeepsInputGraph() const { return fault_ != Fault::kDetachInput; }
  // drop_microbatch: the last microbatch's backward is skipped; zeros go on instead.
  bool DropsBackward(int microbatch) const {
    return fault_ == Fault::kDropMicrobatch && microbatch == microbatches_ - 1;
  }
  // detach_input: a backward that produced no input gradient sends zeros instead of failing.
  bool SendsZerosForMissingGradient() const { return fault_ == Fault::kDetachInput; }
  // The denominator of a microbatch's loss term: the whole batch's tokens, or
  // (mean_of_microbatch_means) the microbatch's own tokens times the number of microbatches.
  double LossDenominator(int64_t microbatch_tokens, int64_t batch_tokens) const;
  // stale_shape: the first message of each direction fixes the buffer later ones are copied into.
  torch::Tensor ReceivedMessage(const torch::Tensor& message, Direction direction);
  // swap_boundary_shapes: the shape a send's header states, when it lies: the last shape
  // received in the other direction (activation <-> gradient), where that differs.
  std::optional<MessageShape> AnnouncedShape(Direction direction, const torch::Tensor& tensor) const;
  void BeginStep() {
    first_shape_.clear();
    last_shape_.clear();
  }
  // zero_grad_per_microbatch / grad_scale_per_microbatch, around each backward.
  // reversed_accumulation: after each backward, rank 0 moves every fresh gradient aside.
  void BeforeBackward(const std::vector<torch::Tensor>& parameters) const;
  void AfterBackward(const std::vector<torch::Tensor>& parameters);
  // double_grad_scaling: gradients divided by m once more after accumulation.
  // reversed_accumulation: rank 0's held gradients summed newest first, as a trainer that keeps
  // per-microbatch gradients for overlap and reduces them last-in-first-out would. Every value
  // stays right to rounding (parity passes); only the invariance matrix sees the changed order.
  void AfterAccumulation(const std::vector<torch::Tensor>& parameters);
  // zb_shared_weight_grad_twice: around a W, the tied embedding's gradient before it (undefined
  // unless the fault is on and `module` holds the weight), then its contribution added once more.
  torch::Tensor SharedWeightGradient(const torch::nn::Module& module) const;
  void AfterWeightGradient(const torch::nn::Module& module, const torch::Tensor& before) const;
  // send_buffer_reuse: the bytes the peer receives for an activation send (see faults.cc).
  bool ReusesSendBuffer() const { return fault_ == Fault::kSendBufferReuse; }
  // duplicate_send: each activation goes out twice and the receiver posts a second receive for
  // the copy and drops it, as a retry wrapper that re-sends a delivered message would (and its
  // receiver-side counterpart). Every number stays right; only the communication check sees it.
  bool DuplicatesSends() const { return fault_ == Fault::kDuplicateSend; }
  // slow_steps: every rank keeps its core busy for a quarter of its step's time (since
  // `started`) before the step ends, as a regression that adds work would; numbers stay exact, so
  // only a baseline comparison of tokens/s (-20%) sees it. Does nothing under any other fault.
  void StretchStep(std::chrono::steady_clock::time_point started) const;
  // optimizer_state_reset: the optimizer is rebuilt at every step.
  bool ResetsOptimizer() const { return fault_ == Fault::kOptimizerStateReset; }
  // clip_before_tied_sync: the clipping norm is taken before the tied sum.
  bool ClipsBeforeTiedSync() const { return fault_ == Fault::kClipBeforeTiedSync; }
  // Gradient-sync faults (gradient_sync.cc).
  bool SkipsTiedSync() const { return fault_ == Fault::kSkipTiedSync; }
  bool CountsTiedTwice() const { return fault_ == Fault::kTiedNormTwice; }
  bool ClipsLocally() const { return fault_ == Fault::kLocalClip; }
  // crash_rank / hang_rank / killed_rank: the last rank aborts, stops, or is SIGKILLed half-way
  // through its list in step 1
  // (step 0 when the scenario has only one step). Called before each action.
  void BeforeAction(int rank, int world_size, int64_t step, int64_t steps, size_t index, size_t actions) const;

 private:
  Fault fault_;
  int microbatches_;
  int rank_;
  std::map<const void*, std::vector<torch::Tensor>> held_;  // per parameter, its microbatches' gradients (reversed_accumulation)
  std::map<Direction, std::vector<int64_t>> first_shape_;  // per direction (stale_shape), for one step
  std::map<Direction, std::vector<int64_t>> last_shape_;   // per direction (swap_boundary_shapes)
};

}  // namespace pipecheck::pipeline
