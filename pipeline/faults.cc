// The injected faults (see faults.h): one class each, then the registry.
#include "pipeline/faults.h"

#include <fmt/format.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include "pipeline/stage.h"
#include "reference/optimizer.h"

namespace pipecheck::pipeline {

std::unique_ptr<PendingSend> Fault::Send(Transport& inner, const torch::Tensor& tensor, int peer, int tag) {
  return inner.Send(tensor, peer, tag, std::nullopt);
}

std::unique_ptr<PendingRecv> Fault::Recv(Transport& inner, int peer, int tag, torch::Device device,
                                         const std::optional<MessageShape>& expected) {
  return inner.Recv(peer, tag, device, expected);
}

std::unique_ptr<PendingSend> FaultyTransport::Send(const torch::Tensor& tensor, int peer, int tag,
                                                   const std::optional<MessageShape>& /*announced*/) {
  return fault_.Send(inner_, tensor, peer, tag);
}

std::unique_ptr<PendingRecv> FaultyTransport::Recv(int peer, int tag, torch::Device device,
                                                   const std::optional<MessageShape>& expected) {
  return fault_.Recv(inner_, peer, tag, device, expected);
}

namespace {

bool IsActivation(int tag) { return DecodeTag(tag).direction == Direction::kActivation; }

// A receive whose message is changed on arrival.
class TransformedRecv : public PendingRecv {
 public:
  TransformedRecv(std::unique_ptr<PendingRecv> inner, std::function<torch::Tensor(torch::Tensor)> transform)
      : inner_(std::move(inner)), transform_(std::move(transform)) {}
  torch::Tensor Wait() override { return transform_(inner_->Wait()); }

 private:
  std::unique_ptr<PendingRecv> inner_;
  std::function<torch::Tensor(torch::Tensor)> transform_;
};

// detach_input: a stage's received activation is used without its graph; the backward that
// then has no input gradient sends zeros instead of failing.
class DetachInput : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor ReceivedInput(const torch::Tensor& input) const override { return input.detach(); }
  torch::Tensor InputGradient(const torch::Tensor& gradient, const torch::Tensor& input) const override {
    return gradient.defined() ? gradient : torch::zeros_like(input);
  }
};

// mean_of_microbatch_means: each microbatch's loss divided by its own tokens, then by m (and by
// the replicas, whose gradients are summed).
class MeanOfMicrobatchMeans : public Fault {
 public:
  using Fault::Fault;
  double LossDenominator(const LossTokens& tokens) const override {
    return static_cast<double>(tokens.microbatch) * static_cast<double>(context().microbatches) * tokens.replicas;
  }
};

// grad_scale_per_microbatch: the accumulated gradients divided by m after every backward.
class GradScalePerMicrobatch : public Fault {
 public:
  using Fault::Fault;
  void AfterBackward(const std::vector<torch::Tensor>& parameters) override {
    reference::ScaleGradients(parameters, 1.0 / context().microbatches);
  }
};

// zero_grad_per_microbatch: gradients zeroed before each microbatch's backward.
class ZeroGradPerMicrobatch : public Fault {
 public:
  using Fault::Fault;
  void BeforeBackward(const std::vector<torch::Tensor>& parameters) override {
    torch::NoGradGuard no_grad;
    for (const auto& parameter : parameters) {
      if (parameter.grad().defined()) parameter.grad().zero_();
    }
  }
};

// drop_microbatch: the last microbatch's backward contributes nothing (it starts from zeros, so
// its parameters' gradients add zero and zeros go on to the previous stage).
class DropMicrobatch : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor BackwardSeed(const torch::Tensor& gradient, int microbatch) const override {
    return microbatch == context().microbatches - 1 ? torch::zeros_like(gradient) : gradient;
  }
};

// local_clip: each rank clips by its own norm.
class LocalClip : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override { Find(path, GradientOp::kClip)->global_norm = false; }
};

// tied_norm_twice: the tied weight counted on both owners in the global norm.
class TiedNormTwice : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override { Find(path, GradientOp::kClip)->tied_copy_in_norm = true; }
};

// skip_tied_sync: the tied gradients are not summed between their owners.
class SkipTiedSync : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override { Drop(path, GradientOp::kTiedSum); }
};

// stale_shape: the first message of each direction fixes the buffer later ones are copied into;
// what fits is copied, the rest is left as zeros or cut off.
class StaleShape : public Fault {
 public:
  using Fault::Fault;
  void BeginStep() override { first_shape_.clear(); }
  std::unique_ptr<PendingRecv> Recv(Transport& inner, int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    const Direction direction = DecodeTag(tag).direction;
    return std::make_unique<TransformedRecv>(inner.Recv(peer, tag, device, expected),
                                             [this, direction](torch::Tensor message) {
                                               auto& sizes = first_shape_[direction];
                                               if (sizes.empty()) {
                                                 sizes = message.sizes().vec();
                                                 return message;
                                               }
                                               auto buffer = torch::zeros(sizes, message.options());
                                               const int64_t fits = std::min(buffer.numel(), message.numel());
                                               buffer.view(-1).narrow(0, 0, fits).copy_(
                                                   message.reshape(-1).narrow(0, 0, fits));
                                               return buffer;
                                             });
  }

 private:
  std::map<Direction, std::vector<int64_t>> first_shape_;  // per direction, for one step
};

// optimizer_state_reset: the optimizer is rebuilt at every step.
class OptimizerStateReset : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override { Find(path, GradientOp::kOptimizerStep)->fresh_optimizer = true; }
};

// send_before_recv: the lowering pass leaves sends ahead of the receives due with them.
class SendBeforeRecv : public Fault {
 public:
  using Fault::Fault;
  bool PostReceivesFirst() const override { return false; }
};

// crash_rank / hang_rank / killed_rank: the last rank aborts, stops, or gets SIGKILL half-way
// through its list in step 1 (step 0 when the scenario has only one step).
class RankFailure : public Fault {
 public:
  explicit RankFailure(const FaultContext& context) : Fault(context) {}
  void BeforeAction(int64_t step, size_t index, size_t actions) const override {
    const int64_t fault_step = std::min<int64_t>(1, context().steps - 1);
    if (context().rank != context().world_size - 1 || step != fault_step || index != actions / 2) return;
    Fail(step);
  }

 protected:
  virtual void Fail(int64_t step) const = 0;
};

class CrashRank : public RankFailure {
 public:
  using RankFailure::RankFailure;
  void Fail(int64_t step) const override {
    fmt::print(stderr, "fault crash_rank: rank {} aborts in step {}\n", context().rank, step);
    std::abort();
  }
};

class HangRank : public RankFailure {
 public:
  using RankFailure::RankFailure;
  void Fail(int64_t step) const override {
    fmt::print(stderr, "fault hang_rank: rank {} stops making progress in step {}\n", context().rank, step);
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
};

// killed_rank: as from the kernel's OOM killer.
class KilledRank : public RankFailure {
 public:
  using RankFailure::RankFailure;
  void Fail(int64_t step) const override {
    fmt::print(stderr, "fault killed_rank: rank {} gets SIGKILL in step {}\n", context().rank, step);
    std::fflush(stderr);
    raise(SIGKILL);
  }
};

// rank_exits_early: the last rank leaves with exit code 0 half-way through step 1, as a rank whose
// data ran out a step before its peers' does (or a trainer's sys.exit(0) on one rank): no crash,
// no signal, only its peers' lost connections.
class RankExitsEarly : public RankFailure {
 public:
  using RankFailure::RankFailure;
  void Fail(int64_t step) const override {
    fmt::print(stderr, "fault rank_exits_early: rank {} exits with code 0 in step {}\n", context().rank, step);
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(0);
  }
};

// clip_before_tied_sync: the clipping norm computed before the tied gradients are summed.
class ClipBeforeTiedSync : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    path.insert(path.begin(), Take(path, GradientOp::kClip));
  }
};

// double_grad_scaling: gradients divided by m at step end on top of the whole-batch normalisation.
class DoubleGradScaling : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    GradientStage scale;
    scale.name = "double_grad_scaling";
    scale.transform = [m = context().microbatches](const GradientContext& gradients) {
      reference::ScaleGradients(gradients.parameters, 1.0 / m);
    };
    path.insert(path.begin(), scale);
  }
};

// send_buffer_reuse: an activation goes out through a staging buffer that is overwritten at once
// (as a pool handing it back early would), so the peer gets whatever it holds then. The buffer is
// the transport's own (SendBuffer: sent without a copy), so this is a race with the transport's
// thread, as the bug is: a message that left before the overwrite arrives whole, so the first one
// caught may be in any step (seen at step 1 in one run of many).
class SendBufferReuse : public Fault {
 public:
  using Fault::Fault;
  std::unique_ptr<PendingSend> Send(Transport& inner, const torch::Tensor& tensor, int peer, int tag) override {
    if (!IsActivation(tag)) return inner.Send(tensor, peer, tag, std::nullopt);
    auto buffer = inner.SendBuffer(tensor);  // (b, t, hidden)
    buffer.copy_(tensor);
    auto pending = inner.Send(buffer, peer, tag, std::nullopt);
    buffer.zero_();
    return pending;
  }
};

// zb_shared_weight_grad_twice: a split backward's W adds the tied embedding's gradient twice
// (PyTorch #180952).
class ZbSharedWeightGradTwice : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor BeforeWeightGradient(const torch::nn::Module& module) const override {
    const auto weight = SharedWeight(module);
    if (!weight.defined()) return {};
    return weight.grad().defined() ? weight.grad().detach().clone() : torch::zeros_like(weight);
  }
  void AfterWeightGradient(const torch::nn::Module& module, const torch::Tensor& before) const override {
    if (!before.defined()) return;
    auto weight = SharedWeight(module);
    torch::NoGradGuard no_grad;
    weight.grad().add_(weight.grad() - before);  // this microbatch's contribution, once more
  }

 private:
  static torch::Tensor SharedWeight(const torch::nn::Module& module) {
    for (const auto& item : module.named_parameters()) {
      if (item.key() == "tok_embeddings.weight") return item.value();
    }
    return {};
  }
};

// swap_boundary_shapes: a message's header states the last shape received in the other
// direction (activation <-> gradient) where that differs (Megatron MCORE-382).
class SwapBoundaryShapes : public Fault {
 public:
  using Fault::Fault;
  void BeginStep() override { last_shape_.clear(); }
  std::unique_ptr<PendingSend> Send(Transport& inner, const torch::Tensor& tensor, int peer, int tag) override {
    const Direction direction = DecodeTag(tag).direction;
    const auto other =
        last_shape_.find(direction == Direction::kActivation ? Direction::kGradient : Direction::kActivation);
    std::optional<MessageShape> announced;
    if (other != last_shape_.end() && other->second != tensor.sizes().vec()) {
      announced = MessageShape{tensor.scalar_type(), other->second};
    }
    return inner.Send(tensor, peer, tag, announced);
  }
  std::unique_ptr<PendingRecv> Recv(Transport& inner, int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    const Direction direction = DecodeTag(tag).direction;
    return std::make_unique<TransformedRecv>(inner.Recv(peer, tag, device, expected),
                                             [this, direction](torch::Tensor message) {
                                               last_shape_[direction] = message.sizes().vec();
                                               return message;
                                             });
  }

 private:
  std::map<Direction, std::vector<int64_t>> last_shape_;  // per direction, for one step
};

// duplicate_send: each activation goes out twice and the receiver posts a second receive for the
// copy and drops it, as a retry wrapper that re-sends a delivered message would (and its
// receiver-side counterpart). Every number stays right; only the communication check sees it.
class DuplicateSend : public Fault {
 public:
  using Fault::Fault;
  std::unique_ptr<PendingSend> Send(Transport& inner, const torch::Tensor& tensor, int peer, int tag) override {
    auto first = inner.Send(tensor, peer, tag, std::nullopt);
    if (!IsActivation(tag)) return first;
    return std::make_unique<BothSent>(std::move(first), inner.Send(tensor, peer, tag, std::nullopt));
  }
  std::unique_ptr<PendingRecv> Recv(Transport& inner, int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    auto first = inner.Recv(peer, tag, device, expected);
    if (!IsActivation(tag)) return first;
    return std::make_unique<CopyDrained>(std::move(first), inner.Recv(peer, tag, device, expected));
  }

 private:
  struct BothSent : PendingSend {
    BothSent(std::unique_ptr<PendingSend> a, std::unique_ptr<PendingSend> b) : first(std::move(a)), copy(std::move(b)) {}
    void Wait() override {
      first->Wait();
      copy->Wait();
    }
    std::unique_ptr<PendingSend> first, copy;
  };
  struct CopyDrained : PendingRecv {
    CopyDrained(std::unique_ptr<PendingRecv> a, std::unique_ptr<PendingRecv> b) : first(std::move(a)), copy(std::move(b)) {}
    torch::Tensor Wait() override {
      auto message = first->Wait();
      copy->Wait();  // drained and dropped
      return message;
    }
    std::unique_ptr<PendingRecv> first, copy;
  };
};

// reversed_accumulation: rank 0 holds each microbatch's gradients apart and sums them newest
// first, as a trainer that keeps per-microbatch gradients for overlap and reduces them
// last-in-first-out would. Every value stays right to rounding (parity passes); only the
// invariance matrix sees the changed order.
class ReversedAccumulation : public Fault {
 public:
  using Fault::Fault;
  void AfterBackward(const std::vector<torch::Tensor>& parameters) override {
    if (context().rank != 0) return;
    torch::NoGradGuard no_grad;
    for (const auto& parameter : parameters) {
      if (!parameter.grad().defined()) continue;
      held_[parameter.unsafeGetTensorImpl()].push_back(parameter.grad().clone());
      parameter.grad().zero_();  // the next backward adds into zeros: exactly its own gradient
    }
  }
  void EditGradientPath(GradientPath& path) override {
    GradientStage reverse;
    reverse.name = "reversed_accumulation";
    reverse.transform = [this](const GradientContext& gradients) { SumReversed(gradients.parameters); };
    path.insert(path.begin(), reverse);
  }

 private:
  void SumReversed(const std::vector<torch::Tensor>& parameters) {
    torch::NoGradGuard no_grad;
    for (const auto& parameter : parameters) {
      const auto held = held_.find(parameter.unsafeGetTensorImpl());
      if (held == held_.end()) continue;
      torch::Tensor sum = held->second.back().clone();
      for (auto gradient = std::next(held->second.rbegin()); gradient != held->second.rend(); ++gradient) {
        sum.add_(*gradient);
      }
      parameter.grad().copy_(sum);
    }
    held_.clear();
  }

  std::map<const void*, std::vector<torch::Tensor>> held_;  // per parameter, its microbatches' gradients
};

// slow_steps: every rank keeps its core busy for a quarter of its step's time before the step
// ends, as a regression that adds work would; numbers stay exact, so only a baseline comparison
// of tokens/s (-20%) sees it.
class SlowSteps : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    GradientStage busy;
    busy.name = "slow_steps";
    busy.transform = [](const GradientContext& gradients) {
      // Busy, not asleep: a sleeping rank hands its core to the ranks sharing it, which then run
      // faster, and on 2 cores the step grew by far less than a quarter.
      const auto now = std::chrono::steady_clock::now();
      const auto until = now + (now - gradients.step_started) / 4;
      while (std::chrono::steady_clock::now() < until) {
      }
    };
    path.push_back(busy);  // after the optimizer step: the step's end
  }
};

template <typename T>
std::unique_ptr<Fault> Make(const FaultContext& context) {
  return std::make_unique<T>(context);
}

}  // namespace

// dp_sum_not_average: the replicas' gradients summed where their average was meant (an all-reduce
// with SUM where AVG was meant, each replica's loss a mean over its own share): every gradient
// data_parallel times too large, while the loss and the tensors between stages stay right.
class DpSumNotAverage : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    GradientStage scale;
    scale.name = "dp_sum_not_average";
    scale.transform = [d = context().replicas](const GradientContext& gradients) {
      reference::ScaleGradients(gradients.parameters, static_cast<double>(d));
    };
    const auto average = std::find_if(path.begin(), path.end(), [](const GradientStage& stage) {
      return stage.op == GradientOp::kReplicaAverage;
    });
    path.insert(average == path.end() ? average : average + 1, scale);
  }
};

// dp_skip_stage: the last stage's rank never averages across replicas (its bucket left out of
// the data-parallel sync): each replica applies the gradient of its own shard there.
class DpSkipStage : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    if (context().rank == context().world_size - 1) Drop(path, GradientOp::kReplicaAverage);
  }
};

// dp_average_after_first_microbatch: the data-parallel all-reduce issued once the first
// microbatch's backward is done (an overlap hook firing on the first gradient instead of the
// last): later microbatches' gradients stay each replica's own.
class DpAverageAfterFirstMicrobatch : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    Find(path, GradientOp::kReplicaAverage)->after_first_microbatch = true;
  }
};

// dp_average_before_tied_sum: the replicas' average runs before the tied sum, over the
// parameters with the tied weight counted once (the clipping norm's list): the last stage's copy
// enters the sum as its replica's own, so each replica's embedding moves its own way.
class DpAverageBeforeTiedSum : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    GradientStage average = Take(path, GradientOp::kReplicaAverage);
    average.tied_copy_averaged = false;
    path.insert(path.begin(), average);
  }
};

// clip_after_optimizer_step: the gradients clipped after the optimizer has stepped on them (a
// clip_grad_norm_ call placed after optimizer.step()): the update uses the unclipped gradients
// wherever the clip bites, and the clip changes nothing that is used.
class ClipAfterOptimizerStep : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    path.push_back(Take(path, GradientOp::kClip));
  }
};

// dp_local_token_mean: each replica divides its loss by its own tokens (times the replicas, whose
// gradients are summed): a mean of the replicas' means, wrong wherever the replicas' shards hold
// different token counts.
class DpLocalTokenMean : public Fault {
 public:
  using Fault::Fault;
  double LossDenominator(const LossTokens& tokens) const override {
    return static_cast<double>(tokens.replica) * tokens.replicas;  // the replicas' sum: their mean
  }
};

// recompute_stale_input: the input a stage keeps for recomputation lives in one buffer per stage,
// overwritten by every later forward: a backward recomputes from the newest microbatch's input.
class RecomputeStaleInput : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor KeptForRecompute(int stage, const torch::Tensor& input) override {
    auto& buffer = buffers_[stage];
    if (!buffer.defined() || buffer.sizes() != input.sizes()) {
      buffer = torch::empty_like(input).requires_grad_(input.requires_grad());
    }
    {
      torch::NoGradGuard no_grad;
      buffer.copy_(input);
    }
    return buffer;
  }

 private:
  std::map<int, torch::Tensor> buffers_;
};

// stage_keeps_latest_input_gradient (PyTorch #139404): a stage keeps one input gradient, the
// latest its backwards made, not one per microbatch; a schedule that runs a stage's backward of
// the next microbatch before the previous one's gradient has left hands that one on instead.
class StageKeepsLatestInputGradient : public Fault {
 public:
  using Fault::Fault;
  void InputGradientMade(int stage, int /*microbatch*/, const torch::Tensor& gradient) override {
    latest_[stage] = gradient;
  }
  torch::Tensor InputGradientTaken(int stage, int /*microbatch*/, const torch::Tensor& gradient) override {
    const auto it = latest_.find(stage);
    return it == latest_.end() ? gradient : it->second;
  }

 private:
  std::map<int, torch::Tensor> latest_;
};

// recv_buffer_stale_grad (PyTorch #185331): a stage's received activation lands in a receive
// buffer kept from step to step and is handed to the stage as it is; nothing clears the buffer's
// .grad, so each step's input gradient has the previous step's added in.
class RecvBufferStaleGrad : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor ReceiveBuffer(int stage, int microbatch, const torch::Tensor& input) override {
    auto& buffer = buffers_[{stage, microbatch}];
    if (!buffer.defined() || buffer.sizes() != input.sizes()) {
      buffer = input;  // the first step's message becomes the buffer (a leaf that requires grad)
      return buffer;
    }
    torch::NoGradGuard no_grad;
    buffer.copy_(input);
    return buffer;
  }

 private:
  std::map<std::pair<int, int>, torch::Tensor> buffers_;
};

// accumulation_rescaled_per_round (TorchTitan #1733): the schedule rescales the parameters'
// gradients by 1/m at the end of each of its rounds. With one round the scaling is exact; with
// several, every earlier round's sum is divided again at each later round's end, so the step's
// gradient is a moving average of the rounds (round k weighted 1/m^(R-1-k)), not their sum. The
// loss and the boundary tensors stay right: only the parameters' gradients show it. Applied to
// .grad, which holds the sum for float32 and float64 parameters.
class AccumulationRescaledPerRound : public Fault {
 public:
  using Fault::Fault;
  void BeginStep() override { before_.clear(); }
  void AfterRound(int round, const std::vector<torch::Tensor>& parameters) override {
    torch::NoGradGuard no_grad;
    const double m = static_cast<double>(context().microbatches / context().rounds);
    before_.resize(parameters.size());
    for (size_t i = 0; i < parameters.size(); ++i) {
      const auto gradient = parameters[i].grad();
      if (!gradient.defined()) continue;
      if (round > 0 && before_[i].defined()) gradient.sub_(before_[i]).add_(before_[i] / m);
      before_[i] = gradient.clone();
    }
  }

 private:
  std::vector<torch::Tensor> before_;  // each gradient at the last round's end
};

// reinit_on_seq_len_change: a stage that sees an input of another sequence length than its last
// re-initialises itself (its buffers sized anew), and with them the gradients it had accumulated
// this step; with variable lengths only the microbatches since the last change train. The
// forward is untouched: the loss matches, the gradients do not.
class ReinitOnSeqLenChange : public Fault {
 public:
  using Fault::Fault;
  void BeforeForward(int stage, const torch::Tensor& input, const std::vector<torch::Tensor>& parameters) override {
    const int64_t length = input.size(1);
    const auto it = lengths_.find(stage);
    if (it != lengths_.end() && it->second != length) {
      for (auto parameter : parameters) parameter.mutable_grad().reset();
    }
    lengths_[stage] = length;
  }

 private:
  std::map<int, int64_t> lengths_;
};

// loss_with_other_microbatch_labels (DeepSpeed #5729): the last stage's labels come from its own
// data iterator, one microbatch ahead of the outputs it computes the loss of.
class LossWithOtherMicrobatchLabels : public Fault {
 public:
  using Fault::Fault;
  int LabelsOf(int microbatch) const override { return (microbatch + 1) % context().microbatches; }
};

// sum_in_parameter_dtype: bfloat16 gradients added up over the microbatches in bfloat16 (autograd's
// own accumulation into .grad), not in float32: every sum rounds to 8 bits again, a drift the
// whole-batch comparison's bfloat16 tolerance cannot tell from rounding.
class SumInParameterDtype : public Fault {
 public:
  using Fault::Fault;
  void SumAfterBackward(reference::GradientAccumulator& /*accumulator*/) override {}
};

FaultContext FaultContextOf(const PipelineConfig& config, int rank) {
  return {config.microbatches, rank, config.world_size, config.train.steps, config.data_parallel, config.accumulation,
          config.train.dtype};
}

Seams SeamsFor(const PipelineConfig& config, int rank) {
  const std::shared_ptr<Fault> fault = MakeFault(config.fault, FaultContextOf(config, rank));
  Seams seams;
  seams.tensors = fault.get();
  seams.observer = fault.get();
  seams.wrap_messages = [raw = fault.get()](Transport& inner) -> std::unique_ptr<Transport> {
    return std::make_unique<FaultyTransport>(inner, *raw);
  };
  fault->EditGradientPath(seams.gradient_path);
  seams.post_receives_first = fault->PostReceivesFirst();
  seams.correct = config.fault == "none";
  seams.owner = fault;
  return seams;
}

namespace {

// The registry's entries as constants (the same fields as FaultInfo), so the table is data, read
// once into FaultRegistry.
struct FaultEntry {
  const char* name;
  const char* summary;
  std::unique_ptr<Fault> (*make)(const FaultContext&);
  const char* caught_as;
  const char* seen_by;
};

// aux_loss_last_stage_only: only the last stage's MoE layers add their balance loss (to its loss
// term); every other stage's terms are dropped, from its backward and from the reported loss
// (TorchTitan's MoE auxiliary loss under pipelining took it from the last stage: #1689, #2061).
class AuxLossLastStageOnly : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor BalanceTerms(const BalanceTermsAt& at, const torch::Tensor& terms) const override {
    return at.last_stage ? terms : torch::Tensor();
  }
};

// aux_loss_per_microbatch: each microbatch's balance loss at full weight, over its own sequences
// instead of the step's (Megatron's per-microbatch auxiliary losses, not averaged over the
// microbatches: NVIDIA/Megatron-LM #4070): m times too large with m equal microbatches.
class AuxLossPerMicrobatch : public Fault {
 public:
  using Fault::Fault;
  torch::Tensor BalanceTerms(const BalanceTermsAt& at, const torch::Tensor& terms) const override {
    return terms * (static_cast<double>(at.step_sequences) / static_cast<double>(at.microbatch_sequences));
  }
};

// balance_counts_padding: the balance statistics count every position of the padded microbatch,
// padding included, each sequence as long as the microbatch's longest. The same mask decides
// dispatch, so padding is dispatched too: the padded positions' activations differ first.
class BalanceCountsPadding : public Fault {
 public:
  using Fault::Fault;
  void MoeContext(reference::AttentionContext& context) const override {
    context.valid = torch::ones_like(context.valid);
    context.lengths = torch::full_like(context.lengths, static_cast<double>(context.valid.size(1)));
  }
};

// router_logits_bfloat16: the router's logits (and so its scores and choices) computed in
// bfloat16 rather than float32 (float64 for float64 models).
class RouterLogitsBfloat16 : public Fault {
 public:
  using Fault::Fault;
  void MoeContext(reference::AttentionContext& context) const override { context.router_dtype = torch::kBFloat16; }
};

// aux_total_dropped_on_dense_rank: the head's rank adds the balance loss to the reported loss only
// when its own stages hold an MoE layer; with dense or empty last stages it reports the cross
// entropy alone (the gradients stay right: only the loss is wrong).
class AuxTotalDroppedOnDenseRank : public Fault {
 public:
  using Fault::Fault;
  double ReportedBalanceLoss(double total, bool own_moe_layers) const override { return own_moe_layers ? total : 0.0; }
};

// unrouted_expert_dropped_by_accumulation: a parameter that a microbatch's backward gives nothing
// (an expert none of the microbatch's tokens chose) loses the gradient earlier microbatches
// gathered for it, as an accumulation that rebuilds its list from each backward's gradients
// would have it: only the experts the last microbatch reached keep their whole sums.
class UnroutedExpertDroppedByAccumulation : public Fault {
 public:
  using Fault::Fault;
  void BeforeBackward(const std::vector<torch::Tensor>& parameters) override {
    before_.clear();
    for (const auto& parameter : parameters) {
      before_.push_back(parameter.grad().defined() ? parameter.grad().clone() : torch::Tensor());
    }
  }
  void AfterBackward(const std::vector<torch::Tensor>& parameters) override {
    for (size_t i = 0; i < parameters.size() && i < before_.size(); ++i) {
      auto parameter = parameters[i];
      if (before_[i].defined() && torch::equal(before_[i], parameter.grad())) parameter.mutable_grad().reset();
    }
  }

 private:
  std::vector<torch::Tensor> before_;
};

// unrouted_expert_skipped_in_dp_average: a replica whose tokens chose no expert e skips e in the
// data-parallel average (an all-reduce over the parameters that have a gradient): it keeps no
// gradient for e and does not step it, while the replicas whose tokens reached e do. Their
// copies of e drift apart.
class UnroutedExpertSkippedInDpAverage : public Fault {
 public:
  using Fault::Fault;
  void EditGradientPath(GradientPath& path) override {
    Find(path, GradientOp::kReplicaAverage)->unrouted_skipped = true;
  }
};

// router_choice_rounding: not a bug. Each token's choice values (scores plus bias) move by up to
// half the row's tolerance times the logits' rounding scale, by a fixed pattern, as another
// kernel's rounding of the router could move them on another device: only choices decided within
// rounding flip. The judge's reference takes those from the pipeline (routing_adopted), so the row
// passes; a routing judge that cried wolf at them would fail it.
class RouterChoiceRounding : public Fault {
 public:
  using Fault::Fault;
  void MoeContext(reference::AttentionContext& routing) const override {
    // Half the dtype's default tolerance (docs/scenarios.md's `tol`).
    const auto dtype = context().dtype;
    routing.choice_jitter = 0.5 * (dtype == torch::kFloat64 ? 1e-9 : dtype == torch::kFloat32 ? 1e-4 : 3e-2);
  }
};

// bias_counts_recomputed: under recomputation each backward's forward counts its microbatch's
// routing again, so every count of the step doubles. The biases move by the sign of the mean
// minus each count, which doubling leaves as it was: the counts themselves show it (and every
// balance metric read off them).
class BiasCountsRecomputed : public Fault {
 public:
  using Fault::Fault;
  void CountRouting(bool /*recomputed*/, const std::map<int64_t, torch::Tensor>& counts,
                    std::map<int64_t, torch::Tensor>& step_counts) const override {
    TensorSeams::CountRouting(/*recomputed=*/false, counts, step_counts);
  }
};

// bias_counts_last_microbatch: each forward's counts replace the step's instead of adding to
// them, so the biases move by the rank's last microbatch's routing alone.
class BiasCountsLastMicrobatch : public Fault {
 public:
  using Fault::Fault;
  void CountRouting(bool recomputed, const std::map<int64_t, torch::Tensor>& counts,
                    std::map<int64_t, torch::Tensor>& step_counts) const override {
    if (recomputed) return;
    for (const auto& [layer, layer_counts] : counts) step_counts[layer] = layer_counts;
  }
};

// bias_counts_not_summed_over_replicas: each replica moves its biases by its own microbatches'
// counts, not the whole batch's: the replicas' biases drift apart.
class BiasCountsNotSummedOverReplicas : public Fault {
 public:
  using Fault::Fault;
  bool CountsSummedOverReplicas() const override { return false; }
};

// bias_moved_before_step: a rank moves its expert biases as soon as its last forward has counted,
// before its backwards and the optimizer step. The biases end the step where they should, but a
// recomputed forward (recompute=1) routes with the moved ones: its backward differentiates
// another routing than the forward's.
class BiasMovedBeforeStep : public Fault {
 public:
  using Fault::Fault;
  bool BiasMovedAfterForwards() const override { return true; }
};

// adam_step_reset_at_load: a resumed rank loads AdamW's moments but not its step count, which
// restarts at 0: the next update's bias correction is the first step's.
class AdamStepResetAtLoad : public Fault {
 public:
  using Fault::Fault;
  bool RestoresAdamStep() const override { return false; }
};

// moments_loaded_by_position: a resumed rank takes each parameter's moments by its position among
// the saved parameters of the stage with its stage's index, as a positional optimizer state dict
// maps them: right at an unchanged partition, another layer's moments after a re-partition.
class MomentsLoadedByPosition : public Fault {
 public:
  using Fault::Fault;
  bool MomentsByName() const override { return false; }
};

// tied_copy_not_restored: the last stage's copy of a tied weight is not loaded: a head that moved
// to a new last stage keeps its initial values.
class TiedCopyNotRestored : public Fault {
 public:
  using Fault::Fault;
  bool RestoresTiedHeadCopy() const override { return false; }
};

// data_position_lost: the data position is not loaded: the resumed run trains on the first
// batches again.
class DataPositionLost : public Fault {
 public:
  using Fault::Fault;
  bool RestoresDataPosition() const override { return false; }
};

// replica_loads_other_shard: each replica but the first loads the data position the replica
// before it saved, and trains on that replica's share of every batch: two replicas on the same
// sequences, the last share on none.
class ReplicaLoadsOtherShard : public Fault {
 public:
  using Fault::Fault;
  int DataReplicaToLoad(int replica, int /*replicas*/) const override { return replica > 0 ? replica - 1 : 0; }
};

// missing_stage_file_loaded: the rank of the last stage writes no file (a checkpoint interval
// that saved nothing), rank 0 commits what is there, and the resumed ranks load it anyway,
// leaving that stage's parameters where they were.
class MissingStageFileLoaded : public Fault {
 public:
  using Fault::Fault;
  bool WritesStageFile(int stage, int stages) const override { return stage != stages - 1; }
  bool RequiresCompleteCheckpoint() const override { return false; }
};

constexpr FaultEntry kFaults[] = {
  {"none", "the correct pipeline", Make<Fault>, "", ""},
  {"detach_input", "a stage's received activation is detached before use", Make<DetachInput>,
   "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err 1 > tol", ""},
  {"mean_of_microbatch_means", "each microbatch's loss divided by its own tokens, then by m",
   Make<MeanOfMicrobatchMeans>,
   "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err .* against the reference cut", ""},
  {"grad_scale_per_microbatch", "accumulated gradients divided by m after every microbatch",
   Make<GradScalePerMicrobatch>,
   "^gradient of tok_embeddings.weight at step 0 on rank 0 \\(stage 0\\): rel err", ""},
  {"zero_grad_per_microbatch", "gradients zeroed before each microbatch's backward", Make<ZeroGradPerMicrobatch>,
   "^gradient of tok_embeddings.weight at step 0 on rank 0 \\(stage 0\\): rel err", ""},
  {"drop_microbatch", "the last microbatch's backward contributes nothing (zeros sent on)", Make<DropMicrobatch>,
   "^step 0, microbatch 3: gradient into stage 0 \\(from rank 1\\) rel err 1 > tol", ""},
  {"local_clip", "each rank clips by its own norm", Make<LocalClip>,
   "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"tied_norm_twice", "the tied weight counted on both owners in the global norm", Make<TiedNormTwice>,
   "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"skip_tied_sync", "tied gradients not summed between their owners", Make<SkipTiedSync>,
   "^communication, step 0: rank [02]'s message #[0-9]+ is a missing message: it posted nothing, where the plan "
   "has receive the tied weight's gradient", ""},
  {"stale_shape", "receive buffers sized from the first microbatch, reused", Make<StaleShape>,
   "^rank 1 exited with code 1; its last output: pipecheck worker rank 1: The size of tensor", ""},
  {"optimizer_state_reset", "the optimizer rebuilt at every step", Make<OptimizerStateReset>,
   "^update of .* at step 1 on rank [01] \\(stage [01]\\): rel err .* against one reference optimizer step", ""},
  {"send_before_recv", "blocking sends issued before the matching receives are posted", Make<SendBeforeRecv>,
   "invalid when sends wait for receives: deadlock", ""},
  {"crash_rank", "the last rank aborts in the middle of step 1", Make<CrashRank>,
   "^rank 2 was killed by signal 6 \\(Aborted\\); its last output: fault crash_rank: rank 2 aborts in step 1", ""},
  {"hang_rank", "the last rank stops making progress in the middle of step 1", Make<HangRank>,
   "^rank\\(s\\) 0, 1 still running after the 8 s deadline, none of them making progress for [0-9.]+ s "
   "\\(hung\\): rank 0 waiting in 0[BF][0-9] \\(step 1\\) for its input from rank 1; rank 1 last "
   "finished 1[A-Z_]+[0-9]+.*\\(step 1\\); nothing "
   "started since; last output: .*rank 1: fault hang_rank: rank 1 stops", ""},
  {"clip_before_tied_sync", "the clipping norm computed before the tied gradients are summed",
   Make<ClipBeforeTiedSync>,
   "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"double_grad_scaling", "gradients divided by m at step end on top of the whole-batch normalisation",
   Make<DoubleGradScaling>,
   "^gradient of tok_embeddings.weight at step 0 on rank 0 \\(stage 0\\): rel err", ""},
  {"send_buffer_reuse", "an activation's send buffer overwritten before its send completed",
   Make<SendBufferReuse>,
   "^step [0-9]+, microbatch [0-9]+: activation into stage 1 changed between rank 0's send and rank 1's receive", ""},
  {"zb_shared_weight_grad_twice", "a split backward's W adds the tied embedding's gradient twice",
   Make<ZbSharedWeightGradTwice>,
   "^gradient of tok_embeddings.weight at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"swap_boundary_shapes", "a boundary message's header states the other direction's last shape",
   Make<SwapBoundaryShapes>,
   "message from rank [01] \\(the .* for stage [0-9]+, microbatch [0-9]+\\) is .* but the plan expects", ""},
  {"duplicate_send", "every activation sent twice, the copy drained by its receiver", Make<DuplicateSend>,
   "^communication, step 0: rank 0's message #[0-9]+ is an extra message: it posted send the activation for "
   "stage 1, microbatch 0 to rank 1", ""},
  {"reversed_accumulation", "rank 0 sums each microbatch's gradients newest first", Make<ReversedAccumulation>,
   "", "pipecheck invariance: the sums' order changes the bits, not the values"},
  {"router_choice_rounding", "each token's choice values moved within half the default tolerance of the logits' "
   "rounding scale (not a bug: choices decided within rounding flip)", Make<RouterChoiceRounding>,
   "", "parity, which passes: the reference takes those choices from the pipeline (routing_adopted)"},
  {"slow_steps", "every rank busy a quarter longer each step", Make<SlowSteps>,
   "", "a baseline comparison of tokens/s: every value stays exact"},
  {"killed_rank", "the last rank gets SIGKILL in the middle of step 1", Make<KilledRank>,
   "^rank 1 was killed by signal 9 \\(Killed\\) from outside pipecheck: the kernel's OOM killer", ""},
  {"rank_exits_early", "the last rank exits with code 0 in the middle of step 1", Make<RankExitsEarly>,
   "^rank 1 exited with code 0 after [0-9A-Z_]+ \\(step 1\\) while its peers still needed it: rank\\(s\\) 0 then "
   "lost their connection; its last output: fault rank_exits_early: rank 1 exits with code 0 in step 1; rank 0's: "
   "pipecheck worker rank 0: .*Connection (closed|reset) by peer", ""},
  {"dp_sum_not_average", "replicas' gradients summed, not averaged", Make<DpSumNotAverage>,
   "^gradient of .* at step 0 on replica [01] rank [01] \\(stage [01]\\): rel err 1 > tol", ""},
  {"dp_skip_stage", "the last stage's rank skips the data-parallel average", Make<DpSkipStage>,
   "^gradient of .* at step 0 on replica [01] rank 1 \\(stage 1\\): rel err", ""},
  {"dp_average_after_first_microbatch", "the data-parallel average issued after the first microbatch's backward",
   Make<DpAverageAfterFirstMicrobatch>,
   "^gradient of .* at step 0 on replica [01] rank [01] \\(stage [01]\\): rel err", ""},
  {"dp_average_before_tied_sum", "the replicas' average before the tied sum, the tied weight counted once",
   Make<DpAverageBeforeTiedSum>,
   "^gradient of tok_embeddings.weight at step 0 on replica [01] rank [01] \\(stage [01]\\): rel err", ""},
  {"dp_local_token_mean", "each replica's loss divided by its own tokens, then averaged",
   Make<DpLocalTokenMean>,
   "^replica [01]: step 0, microbatch [0-9]+: gradient into stage 0 \\(from rank 1\\) rel err .*; worst "
   "gradient .* on replica [01] rank [01] \\(stage [01]\\): rel err", ""},
  {"recompute_stale_input", "a stage's input kept for recomputation in one buffer reused by later microbatches",
   Make<RecomputeStaleInput>,
   "^step 0, microbatch [0-9]+: gradient into stage [01] \\(from rank [12]\\) rel err .*; worst "
   "gradient .* on rank [0-2] \\(stage [0-2]\\): rel err", ""},
  {"stage_keeps_latest_input_gradient", "a stage keeps only its latest backward's input gradient, not one per "
   "microbatch", Make<StageKeepsLatestInputGradient>,
   "^step 0, microbatch [12]: gradient into stage 1 \\(handed over on rank 0\\) rel "
   "err .*; worst gradient .* on rank 0 \\(stage [0-2]\\): rel err", ""},
  {"recv_buffer_stale_grad", "a receive buffer reused across steps keeps its .grad, added into the next step's",
   Make<RecvBufferStaleGrad>,
   "^step 1, microbatch [0-9]+: gradient into stage 0 \\(from rank 1\\) rel err .*; worst "
   "gradient .* at step 1 on rank [01] \\(stage [01]\\): rel err", ""},
  {"accumulation_rescaled_per_round", "gradients divided by m at every accumulation round's end, earlier rounds "
   "again", Make<AccumulationRescaledPerRound>,
   "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"reinit_on_seq_len_change", "a stage re-initialised on a new sequence length, its gradients wiped",
   Make<ReinitOnSeqLenChange>,
   "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"sum_in_parameter_dtype", "bfloat16 gradients summed over the microbatches in bfloat16, not float32",
   Make<SumInParameterDtype>,
   "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err .* > 0.0004 against the "
   "reference summing the same microbatches in float32 \\(a sum in bfloat16\\?\\)", ""},
  {"clip_after_optimizer_step", "the gradients clipped after the optimizer step, which used them unclipped",
   Make<ClipAfterOptimizerStep>, "^gradient of .* at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"loss_with_other_microbatch_labels", "the loss computed with the next microbatch's labels",
   Make<LossWithOtherMicrobatchLabels>,
   "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err", ""},
  {"aux_loss_last_stage_only", "the balance loss taken from the last stage's MoE layers only",
   Make<AuxLossLastStageOnly>,
   "^loss at step 0: pipeline .* vs reference .* at the same weights \\(diff .*; worst gradient "
   "layers\\.1\\.feed_forward\\.router\\.weight at step 0 on rank 0 \\(stage 0\\): rel err", ""},
  {"aux_loss_per_microbatch", "each microbatch's balance loss at full weight (over its own sequences)",
   Make<AuxLossPerMicrobatch>,
   "^step 0, microbatch 0: gradient into stage 0 \\(from rank 1\\) rel err .*; worst gradient "
   "layers\\.[0-9]\\.feed_forward\\.router\\.weight at step [01] on rank [01] \\(stage [01]\\): rel err", ""},
  {"balance_counts_padding", "the balance statistics count padding positions", Make<BalanceCountsPadding>,
   "^step 0, microbatch 0: activation into stage 1 \\(from rank 0\\) rel err .*; worst gradient "
   "layers\\.[0-9]\\.feed_forward\\.router\\.weight at step 0 on rank [01] \\(stage [01]\\): rel err", ""},
  {"router_logits_bfloat16", "the router's logits computed in bfloat16", Make<RouterLogitsBfloat16>,
   "^step 0, microbatch 0: activation into stage 1 \\(from rank 0\\) rel err .* against the reference cut", ""},
  {"aux_total_dropped_on_dense_rank", "the head's rank, holding no MoE layer, reports the loss without the "
   "balance loss", Make<AuxTotalDroppedOnDenseRank>,
   "^loss at step 0: pipeline .* vs reference .* at the same weights \\(diff .* > tol 1e-09\\) \\(\\+[0-9]+ more\\)$", ""},
  {"unrouted_expert_dropped_by_accumulation", "an expert a microbatch's tokens did not reach loses the gradient "
   "earlier microbatches gave it", Make<UnroutedExpertDroppedByAccumulation>,
   "^gradient of layers\\.[0-9]\\.feed_forward\\.experts\\.[0-9]+\\.w[123]\\.weight at step 0 on rank [01] \\(stage "
   "[01]\\): rel err", ""},
  {"unrouted_expert_skipped_in_dp_average", "a replica none of whose tokens chose an expert skips it in the "
   "data-parallel average (replicas drift)", Make<UnroutedExpertSkippedInDpAverage>,
   "^update of layers\\.[0-9]\\.feed_forward\\.experts\\.[0-9]+\\.w[123]\\.weight at step 0 on replica [01] rank [01] "
   "\\(stage [01]\\): rel err 1 > tol", ""},
  {"bias_counts_recomputed", "the routing counts that move the expert biases taken again by each recomputed "
   "forward", Make<BiasCountsRecomputed>,
   "^routing counts layers\\.[0-9]\\.feed_forward\\.expert_counts on rank [01] \\(stage [01]\\) at step 0: pipeline", ""},
  {"bias_counts_last_microbatch", "the expert biases moved by the last microbatch's routing counts only",
   Make<BiasCountsLastMicrobatch>,
   "^routing counts layers\\.[0-9]\\.feed_forward\\.expert_counts on rank [01] \\(stage [01]\\) at step 0: pipeline", ""},
  {"bias_counts_not_summed_over_replicas", "each replica moves its expert biases by its own routing counts",
   Make<BiasCountsNotSummedOverReplicas>,
   "^routing counts layers\\.[0-9]\\.feed_forward\\.expert_counts on replica [01] rank [01] \\(stage [01]\\) at "
   "step 0: pipeline", ""},
  {"bias_moved_before_step", "the expert biases moved after the forwards, before the backwards and the optimizer "
   "step", Make<BiasMovedBeforeStep>,
   "^step 0, microbatch [0-9]: gradient into stage [0-9] \\(from rank [01]\\) rel err", ""},
  {"adam_step_reset_at_load",
   "AdamW's step count restarts at 0 when a resumed run loads its checkpoint",
   Make<AdamStepResetAtLoad>,
   "^resumed after step 2 \\(world_size=4\\): layout 1 \\(steps 2 to 3\\): resume before step 2: "
   "rank [0-3] loaded AdamW's step count of [a-z0-9_.]+ unlike the checkpoint's: 0 where 2 was "
   "saved", ""},
  {"moments_loaded_by_position",
   "optimizer moments loaded by position within the stage of the same index, not by name",
   Make<MomentsLoadedByPosition>,
   "^resumed after step 2 \\(world_size=4\\): layout 1 \\(steps 2 to 3\\): resume before step 2: "
   "rank [0-3] loaded AdamW's exp_avg(_sq)? of layers\\.[0-9][a-z0-9_.]+ unlike the checkpoint's: "
   "[0-9]+ of [0-9]+ elements differ", ""},
  {"tied_copy_not_restored",
   "the last stage's copy of the tied weight not loaded at a resume",
   Make<TiedCopyNotRestored>,
   "^resumed after step 2 \\(world_size=4\\): layout 1 \\(steps 2 to 3\\): resume before step 2: "
   "rank 3 loaded weight tok_embeddings\\.weight unlike the checkpoint's: [0-9]+ of [0-9]+ "
   "elements differ", ""},
  {"data_position_lost",
   "the data position not loaded at a resume: batches repeat",
   Make<DataPositionLost>,
   "^resumed after step 2 \\(schedule=zbv\\): layout 1 \\(steps 2 to 3\\): resume before step 2: "
   "rank 0 loaded data position 0, so its next step trains on batch 0 instead of 2 \\(\\+[0-9]+ "
   "more; worst gradient .* at step 2 on rank [01] \\(stage [0-3]\\): rel err", ""},
  {"replica_loads_other_shard",
   "each replica but the first loads the previous replica's data position at a resume",
   Make<ReplicaLoadsOtherShard>,
   "^resumed after step 2 \\(schedule=gpipe\\): layout 1 \\(steps 2 to 3\\): resume before step "
   "2: replica 1 rank [01] loaded replica 0's data position: it trains on that replica's share of "
   "every batch, not its own \\(\\+[0-9]+ more; worst gradient .* at step [23] on replica [01] "
   "rank [01] \\(stage [01]\\): rel err", ""},
  {"missing_stage_file_loaded",
   "the last stage's checkpoint file never written, the checkpoint loaded anyway",
   Make<MissingStageFileLoaded>,
   "^resumed after step 2 \\(world_size=4\\): layout 1 \\(steps 2 to 3\\): resume before step 2: "
   "the checkpoint cannot be loaded \\(.*/checkpoint_after_step2/manifest.json: a layout of 2 "
   "stages and 1 replicas writes stage1\\.pt, which the manifest does not list: the checkpoint is "
   "incomplete\\), yet the ranks loaded it: rank [23] loaded weight [a-z0-9_.]+ unlike where the "
   "previous ranks ended", ""},
};

}  // namespace

const std::vector<FaultInfo>& FaultRegistry() {
  static const std::vector<FaultInfo> registry = [] {
    std::vector<FaultInfo> all;
    for (const auto& entry : kFaults) all.push_back({entry.name, entry.summary, entry.make, entry.caught_as, entry.seen_by});
    return all;
  }();
  return registry;
}

const std::vector<std::string>& FaultNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& info : FaultRegistry()) all.push_back(info.name);
    return all;
  }();
  return names;
}

namespace {

const FaultInfo& FindFault(const std::string& name) {
  for (const auto& info : FaultRegistry()) {
    if (info.name == name) return info;
  }
  throw std::invalid_argument("unknown fault '" + name + "'");
}

}  // namespace

std::unique_ptr<Fault> MakeFault(const std::string& name, const FaultContext& context) {
  return FindFault(name).make(context);
}

const std::string& ParseFault(const std::string& name) { return FindFault(name).name; }

}  // namespace pipecheck::pipeline
