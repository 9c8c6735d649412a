// The pipeline executor and trainer (see trainer.h).
#include "pipeline/trainer.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/serialize.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include "pipeline/gradient_sync.h"
#include "reference/loss.h"

namespace pipecheck::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using StageMicrobatch = std::pair<int, int>;

double MicrosecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Megatron's memory trick: once an output has been sent, backward needs only its graph, so its
// data can go. Only for outputs whose producing op keeps no reference to its own result
// (an addition, an embedding lookup): for any other op freeing could corrupt backward.
void ReleaseOutputData(torch::Tensor& output) {
  const auto function = output.grad_fn();
  if (!function) return;  // an empty stage's output is its input: nothing of its own to free
  const std::string name = function->name();
  if (name == "AddBackward0" || name == "EmbeddingBackward0") output.set_data(torch::empty({0}, output.options()));
}

// Backward from `output` with `gradient`, straight through the engine: unlike
// torch::autograd::backward it does not compare against the output's (possibly freed) data.
void BackwardFrom(const torch::Tensor& output, const torch::Tensor& gradient) {
  torch::autograd::Engine::get_default_engine().execute({torch::autograd::impl::gradient_edge(output)}, {gradient},
                                                        /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);
}

}  // namespace

// Everything one step keeps between actions, keyed by (stage, microbatch). Each entry is
// removed by the action that consumes it, so an empty state at the end proves the list did
// all its work.
struct PipelineTrainer::StepState {
  reference::Batch batch;
  std::vector<reference::Batch> microbatches;
  std::map<StageMicrobatch, torch::Tensor> inputs;       // leaf inputs of non-first stages
  std::map<StageMicrobatch, torch::Tensor> outputs;      // outputs of non-last stages (graph)
  std::map<StageMicrobatch, torch::Tensor> losses;       // last stage's loss terms
  std::map<StageMicrobatch, torch::Tensor> input_grads;  // waiting to be sent or handed on
  std::map<std::tuple<int, int, int>, std::unique_ptr<PendingRecv>> receives;  // (direction, stage, mb)
  std::map<std::tuple<int, int, int>, torch::Tensor> arrived;                   // received, not yet used
  std::map<int, std::vector<int64_t>> first_shape;  // per direction (stale_shape fault only)
  // In-flight sends per (peer, direction), oldest first. Messages of one (peer, direction) are
  // consumed in the order they were sent, so before the next one goes the previous one is waited
  // for and its buffer released: a rank holds at most one send buffer per (peer, direction) in
  // flight instead of every send of the step. Deadlock-free for any schedule the simulator
  // accepts under rendezvous semantics (a send that blocks at once is never later than this).
  std::map<std::pair<int, int>, std::unique_ptr<PendingSend>> sends;
  torch::Tensor loss_sum;  // 0-dim float64 on the device; read once, at step end
};

Schedule BuildSchedule(const PipelineConfig& config) {
  const PipelineShape shape{config.world_size, config.virtual_stages, config.microbatches};
  Schedule lowered = AddCommunication(MakeSchedule(config.schedule, shape),
                                      /*post_receives_first=*/config.fault != Fault::kSendBeforeRecv);
  ValidateSchedule(lowered);
  return lowered;
}

PipelineTrainer::PipelineTrainer(const PipelineConfig& config, Transport& transport)
    : config_(config), transport_(transport), schedule_(BuildSchedule(config)),
      baseline_bytes_(reference::LiveTensorBytes()) {
  TORCH_CHECK(transport.world_size() == config.world_size, "the scenario has world_size ", config.world_size,
              " but ", transport.world_size(), " ranks were started");
  reference::CheckDtypeSupported(config.train.dtype, config.train.device);
  num_stages_ = schedule_.shape.stages();
  stages_ = BuildStages(config, schedule_.shape, transport.rank());
  accumulator_ = std::make_unique<reference::GradientAccumulator>(OwnedParameters(/*count_tied_copy=*/true));
}

PipelineTrainer::~PipelineTrainer() = default;

Stage& PipelineTrainer::StageAt(int stage) { return pipeline::StageAt(stages_, stage, transport_.rank()); }

std::vector<torch::Tensor> PipelineTrainer::OwnedParameters(bool count_tied_copy) const {
  return pipeline::OwnedParameters(stages_, config_.train.model.tied, count_tied_copy);
}

void PipelineTrainer::Forward(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  const auto& part = state.microbatches[mb];
  const auto device = config_.train.device;
  Stage& stage = StageAt(s);
  torch::Tensor input;
  if (s == 0) {
    input = part.tokens.to(device);  // (b, t) int64
  } else if (schedule_.shape.RankOfStage(s - 1) == transport_.rank()) {
    input = state.outputs.at({s - 1, mb}).detach().requires_grad_(true);  // (b, t, hidden)
    state.inputs[{s, mb}] = input;
  } else {
    input = TakeArrived(0, action, state);  // (b, t, hidden)
    if (config_.fault != Fault::kDetachInput) input.requires_grad_(true);
    state.inputs[{s, mb}] = input;
  }
  auto context = reference::MakeAttentionContext(config_.train.model, part.lengths, part.time(), config_.train.dtype,
                                                 device);
  auto output = stage.module->forward(input, context);
  if (stage.slice.has_head) {
    // Summed token loss over the *whole batch's* token count: microbatch terms add up exactly.
    auto loss = reference::TokenLossSum(output, part.labels.to(device)) / LossDenominatorFault(part, state);
    // Accumulated on the device: reading it per microbatch would sync the host with the device.
    auto term = loss.detach().to(torch::kFloat64);
    state.loss_sum = state.loss_sum.defined() ? state.loss_sum + term : term;
    state.losses[{s, mb}] = loss;
  } else {
    state.outputs[{s, mb}] = output;
  }
}

void PipelineTrainer::Backward(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  Stage& stage = StageAt(s);
  // drop_microbatch: the last microbatch's backward never runs; zeros go on instead.
  const bool dropped = config_.fault == Fault::kDropMicrobatch && mb == config_.microbatches - 1;
  BeforeBackwardFault();
  torch::Tensor input_gradient_passthrough;
  if (stage.slice.has_head) {
    auto loss = state.losses.at({s, mb});
    state.losses.erase({s, mb});
    if (!dropped) loss.backward();
  } else {
    torch::Tensor gradient;
    if (schedule_.shape.RankOfStage(s + 1) == transport_.rank()) {
      gradient = state.input_grads.at({s + 1, mb});
      state.input_grads.erase({s + 1, mb});
    } else {
      gradient = TakeArrived(1, action, state);  // (b, t, hidden)
    }
    auto output = state.outputs.at({s, mb});
    state.outputs.erase({s, mb});
    if (!output.grad_fn()) {
      input_gradient_passthrough = gradient;  // an empty stage: its output is its input
    } else if (!dropped) {
      BackwardFrom(output, gradient);
    }
  }
  AfterBackwardFault();
  accumulator_->AfterBackward();
  if (s > 0) {
    auto input = state.inputs.at({s, mb});
    state.inputs.erase({s, mb});
    auto gradient = input_gradient_passthrough.defined() ? input_gradient_passthrough : input.grad();
    // A detached input or a dropped backward leaves no gradient: the buggy pipeline sends zeros.
    if ((!gradient.defined() && config_.fault == Fault::kDetachInput) || dropped) gradient = torch::zeros_like(input);
    TORCH_CHECK(gradient.defined(), "rank ", transport_.rank(), ": ", action.ToString(),
                " produced no gradient for its input");
    state.input_grads[{s, mb}] = gradient;
  }
}

// Completes the receive a compute action consumes, so that the wait is not timed as compute.
void PipelineTrainer::AwaitInput(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  int direction = -1;
  if (action.kind == ActionKind::kForward && s > 0) direction = 0;
  if (action.kind == ActionKind::kBackward && s + 1 < num_stages_) direction = 1;
  if (direction < 0) return;
  auto received = state.receives.find({direction, s, mb});
  if (received == state.receives.end()) return;  // a local handoff, or a missing receive reported later
  state.arrived[{direction, s, mb}] = StaleShapeFault(received->second->Wait(), direction, state);
  state.receives.erase(received);
}

// ---- Fault injection (faults.h) -------------------------------------------------------------

// stale_shape: the first message's shape is kept as the buffer for every later one; what fits
// is copied in, the rest is left as zeros or cut off.
torch::Tensor PipelineTrainer::StaleShapeFault(const torch::Tensor& message, int direction, StepState& state) {
  if (config_.fault != Fault::kStaleShape) return message;
  auto& sizes = state.first_shape[direction];
  if (sizes.empty()) {
    sizes = message.sizes().vec();
    return message;
  }
  auto buffer = torch::zeros(sizes, message.options());
  const int64_t fits = std::min(buffer.numel(), message.numel());
  buffer.view(-1).narrow(0, 0, fits).copy_(message.reshape(-1).narrow(0, 0, fits));
  return buffer;
}

// The loss term's denominator: the whole batch's tokens, or (mean_of_microbatch_means) the
// microbatch's own tokens times the number of microbatches.
double PipelineTrainer::LossDenominatorFault(const reference::Batch& part, const StepState& state) const {
  if (config_.fault == Fault::kMeanOfMicrobatchMeans) {
    return static_cast<double>(part.valid_tokens) * static_cast<double>(config_.microbatches);
  }
  return static_cast<double>(state.batch.valid_tokens);
}

void PipelineTrainer::BeforeBackwardFault() {
  if (config_.fault != Fault::kZeroGradPerMicrobatch) return;
  torch::NoGradGuard no_grad;
  for (auto& parameter : OwnedParameters(true)) {
    if (parameter.grad().defined()) parameter.grad().zero_();
  }
}

void PipelineTrainer::AfterBackwardFault() {
  if (config_.fault != Fault::kGradScalePerMicrobatch) return;
  reference::ScaleGradients(OwnedParameters(true), 1.0 / config_.microbatches);
}

// crash_rank / hang_rank: the last rank dies or stops half-way through step 1 (step 0 when
// the scenario has only one).
void PipelineTrainer::ProcessFault(int64_t step, size_t action_index) const {
  const int64_t fault_step = std::min<int64_t>(1, config_.train.steps - 1);
  const bool here = transport_.rank() == transport_.world_size() - 1 && step == fault_step &&
                    action_index == schedule_.ranks[transport_.rank()].size() / 2;
  if (!here) return;
  if (config_.fault == Fault::kCrashRank) {
    fmt::print(stderr, "fault crash_rank: rank {} aborts in step {}\n", transport_.rank(), step);
    std::abort();
  }
  if (config_.fault == Fault::kHangRank) {
    fmt::print(stderr, "fault hang_rank: rank {} stops making progress in step {}\n", transport_.rank(), step);
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

// send_buffer_reuse: activations go out through one staging buffer that the next use
// overwrites without waiting for the previous send to complete (here: at once, as a pool
// handing the buffer back early would), so the peer receives whatever the buffer holds then.
void PipelineTrainer::SendFromReusedBuffer(const torch::Tensor& output, int stage, int microbatch, StepState& state) {
  auto buffer = output.detach().clone();  // (b, t, hidden)
  IssueSend(buffer, schedule_.shape.RankOfStage(stage + 1), Direction::kActivation,
            MessageTag(Direction::kActivation, stage + 1, microbatch), state);
  buffer.zero_();
}

void PipelineTrainer::IssueSend(const torch::Tensor& tensor, int peer, Direction direction, int tag, StepState& state) {
  auto& in_flight = state.sends[{peer, static_cast<int>(direction)}];
  if (in_flight) in_flight->Wait();  // the previous message to this peer and direction has left
  in_flight = transport_.Send(tensor, peer, tag);
}

torch::Tensor PipelineTrainer::TakeArrived(int direction, const Action& action, StepState& state) {
  auto arrived = state.arrived.find({direction, action.stage, action.microbatch});
  TORCH_CHECK(arrived != state.arrived.end(), "rank ", transport_.rank(), ": ", action.ToString(),
              " has no received ", direction == 0 ? "input" : "output gradient", " (no receive was posted)");
  auto tensor = arrived->second;
  state.arrived.erase(arrived);
  return tensor;
}

void PipelineTrainer::Execute(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  const auto device = config_.train.device;
  switch (action.kind) {
    case ActionKind::kForward:
      Forward(action, state);
      break;
    case ActionKind::kBackward:
      Backward(action, state);
      break;
    case ActionKind::kRecvForward:
      state.receives[{0, s, mb}] = transport_.Recv(schedule_.shape.RankOfStage(s - 1),
                                                   MessageTag(Direction::kActivation, s, mb), device);
      break;
    case ActionKind::kRecvBackward:
      state.receives[{1, s, mb}] = transport_.Recv(schedule_.shape.RankOfStage(s + 1),
                                                   MessageTag(Direction::kGradient, s, mb), device);
      break;
    case ActionKind::kSendForward: {
      auto& output = state.outputs.at({s, mb});
      if (config_.fault == Fault::kSendBufferReuse) {
        SendFromReusedBuffer(output, s, mb, state);
        break;
      }
      IssueSend(output.detach(), schedule_.shape.RankOfStage(s + 1), Direction::kActivation,
                MessageTag(Direction::kActivation, s + 1, mb), state);
      ReleaseOutputData(output);
      break;
    }
    case ActionKind::kSendBackward: {
      auto gradient = state.input_grads.at({s, mb});
      state.input_grads.erase({s, mb});
      IssueSend(gradient, schedule_.shape.RankOfStage(s - 1), Direction::kGradient,
                MessageTag(Direction::kGradient, s - 1, mb), state);
      break;
    }
    default:
      TORCH_CHECK(false, "rank ", transport_.rank(), ": action ", action.ToString(),
                  " (split backward) is not supported by this executor yet");
  }
}

reference::NamedTensors PipelineTrainer::WeightCopies() const {
  reference::NamedTensors weights;
  for (const auto& stage : stages_) {
    for (const auto& item : stage->module->named_parameters()) weights.insert(item.key(), item.value().detach().clone());
  }
  return weights;
}

void PipelineTrainer::RecordWeights(RankResult& result) {
  auto weights = WeightCopies();
  copies_bytes_ += reference::TensorBytes(weights);
  result.weights.push_back(std::move(weights));
}

void PipelineTrainer::Step(int64_t step, RankResult& result) {
  if (config_.train.record_gradients) RecordWeights(result);
  accumulator_->Begin();
  if (config_.fault == Fault::kOptimizerStateReset) {
    for (auto& stage : stages_) stage->optimizer = reference::MakeOptimizer(config_.train.optimizer, stage->parameters);
  }
  reference::StepMemory memory(baseline_bytes_);
  memory.BeginStep(copies_bytes_);
  StepState state;
  state.batch = reference::MakeBatch(config_.train.data, config_.train.seed, step);
  state.microbatches = reference::SplitMicrobatches(state.batch, config_.microbatches);

  const auto start = Clock::now();
  const auto& actions = schedule_.ranks[transport_.rank()];
  for (size_t index = 0; index < actions.size(); ++index) {
    const Action& action = actions[index];
    ProcessFault(step, index);
    AwaitInput(action, state);
    const double action_start = MicrosecondsSince(start);
    Execute(action, state);
    result.timeline.push_back({step, action, action_start, MicrosecondsSince(start)});
  }
  for (auto& [peer_direction, send] : state.sends) send->Wait();
  state.sends.clear();
  TORCH_CHECK(state.receives.empty() && state.arrived.empty() && state.inputs.empty() && state.outputs.empty() && state.losses.empty() &&
                  state.input_grads.empty(),
              "rank ", transport_.rank(), " step ", step, " ended with work pending: ", state.receives.size(),
              " receives, ", state.inputs.size(), " inputs, ", state.outputs.size(), " outputs, ", state.losses.size(),
              " losses, ", state.input_grads.size(), " gradients");
  accumulator_->Finish();
  if (config_.fault == Fault::kDoubleGradScaling) {
    reference::ScaleGradients(OwnedParameters(true), 1.0 / config_.microbatches);
  }
  if (config_.fault == Fault::kClipBeforeTiedSync) {
    result.grad_norms.push_back(ClipGradients(stages_, config_, transport_));
    SyncTiedGradients(stages_, config_, schedule_.shape, transport_);
  } else {
    SyncTiedGradients(stages_, config_, schedule_.shape, transport_);
    result.grad_norms.push_back(ClipGradients(stages_, config_, transport_));
  }
  const auto backward_done = Clock::now();

  memory.PauseForCopies();
  if (config_.train.record_gradients) {
    reference::NamedTensors gradients;
    for (const auto& stage : stages_) {
      for (const auto& item : stage->module->named_parameters()) {
        if (item.value().grad().defined()) gradients.insert(item.key(), item.value().grad().detach().clone());
      }
    }
    copies_bytes_ += reference::TensorBytes(gradients);
    result.gradients.push_back(std::move(gradients));
  }
  memory.ResumeAfterCopies(copies_bytes_);

  const auto update_start = Clock::now();
  reference::GradientsToParameterDtype(OwnedParameters(true));
  for (auto& stage : stages_) stage->optimizer->step();
  const auto end = Clock::now();
  result.peak_bytes.push_back(memory.EndStep());
  result.step_ms.push_back(
      std::chrono::duration<double, std::milli>((backward_done - start) + (end - update_start)).count());
  const bool has_loss = stages_.back()->slice.has_head;
  result.losses.push_back(has_loss && state.loss_sum.defined() ? state.loss_sum.item<double>()
                                                              : std::numeric_limits<double>::quiet_NaN());
}

RankResult PipelineTrainer::Train(const std::function<void(int64_t, const RankResult&)>& after_step) {
  RankResult result;
  result.rank = transport_.rank();
  for (const auto& stage : stages_) result.stages.push_back(stage->index);
  for (int64_t step = 0; step < config_.train.steps; ++step) {
    Step(step, result);
    if (after_step) after_step(step, result);
  }
  result.final_weights = WeightCopies();
  return result;
}

}  // namespace pipecheck::pipeline
