// The injected faults (see faults.h).
#include "pipeline/faults.h"

#include <fmt/format.h>
#include <torch/utils.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <iterator>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "reference/optimizer.h"

namespace pipecheck::pipeline {

const std::vector<std::string>& FaultNames() {
  static const std::vector<std::string> names = {
      "none",           "detach_input",   "mean_of_microbatch_means", "grad_scale_per_microbatch",
      "zero_grad_per_microbatch", "drop_microbatch", "local_clip",    "tied_norm_twice",
      "skip_tied_sync", "stale_shape",    "optimizer_state_reset",    "send_before_recv",
      "crash_rank",     "hang_rank",      "clip_before_tied_sync",    "double_grad_scaling",
      "send_buffer_reuse", "zb_shared_weight_grad_twice", "swap_boundary_shapes",
      "duplicate_send", "reversed_accumulation", "slow_steps", "killed_rank"};
  return names;
}

Fault ParseFault(const std::string& name) {
  const auto& names = FaultNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Fault>(i);
  }
  throw std::invalid_argument("unknown fault '" + name + "'");
}

void Faults::StretchStep(std::chrono::steady_clock::time_point started) const {
  if (fault_ != Fault::kSlowSteps) return;
  // Busy, not asleep: a sleeping rank hands its core to the ranks sharing it, which then run
  // faster, and on 2 cores the step grew by far less than a quarter (tokens/s -14% instead of
  // -20%, measured with LibTorch 2.11).
  const auto now = std::chrono::steady_clock::now();
  const auto until = now + (now - started) / 4;
  while (std::chrono::steady_clock::now() < until) {
  }
}

double Faults::LossDenominator(int64_t microbatch_tokens, int64_t batch_tokens) const {
  if (fault_ == Fault::kMeanOfMicrobatchMeans) {
    return static_cast<double>(microbatch_tokens) * static_cast<double>(microbatches_);
  }
  return static_cast<double>(batch_tokens);
}

// The first message's shape is kept as the buffer for every later one; what fits is copied in,
// the rest is left as zeros or cut off.
torch::Tensor Faults::ReceivedMessage(const torch::Tensor& message, Direction direction) {
  if (fault_ == Fault::kSwapBoundaryShapes) last_shape_[direction] = message.sizes().vec();
  if (fault_ != Fault::kStaleShape) return message;
  auto& sizes = first_shape_[direction];
  if (sizes.empty()) {
    sizes = message.sizes().vec();
    return message;
  }
  auto buffer = torch::zeros(sizes, message.options());
  const int64_t fits = std::min(buffer.numel(), message.numel());
  buffer.view(-1).narrow(0, 0, fits).copy_(message.reshape(-1).narrow(0, 0, fits));
  return buffer;
}

std::optional<MessageShape> Faults::AnnouncedShape(Direction direction, const torch::Tensor& tensor) const {
  if (fault_ != Fault::kSwapBoundaryShapes) return std::nullopt;
  const auto other =
      last_shape_.find(direction == Direction::kActivation ? Direction::kGradient : Direction::kActivation);
  if (other == last_shape_.end() || other->second == tensor.sizes().vec()) return std::nullopt;
  return MessageShape{tensor.scalar_type(), other->second};
}

void Faults::BeforeBackward(const std::vector<torch::Tensor>& parameters) const {
  if (fault_ != Fault::kZeroGradPerMicrobatch) return;
  torch::NoGradGuard no_grad;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) parameter.grad().zero_();
  }
}

void Faults::AfterBackward(const std::vector<torch::Tensor>& parameters) {
  if (fault_ == Fault::kGradScalePerMicrobatch) reference::ScaleGradients(parameters, 1.0 / microbatches_);
  if (fault_ != Fault::kReversedAccumulation || rank_ != 0) return;
  torch::NoGradGuard no_grad;
  for (const auto& parameter : parameters) {
    if (!parameter.grad().defined()) continue;
    held_[parameter.unsafeGetTensorImpl()].push_back(parameter.grad().clone());
    parameter.grad().zero_();  // the next backward adds into zeros: exactly its own gradient
  }
}

void Faults::AfterAccumulation(const std::vector<torch::Tensor>& parameters) {
  if (fault_ == Fault::kDoubleGradScaling) reference::ScaleGradients(parameters, 1.0 / microbatches_);
  if (fault_ != Fault::kReversedAccumulation) return;
  torch::NoGradGuard no_grad;
  for (const auto& parameter : parameters) {
    const auto held = held_.find(parameter.unsafeGetTensorImpl());
    if (held == held_.end()) continue;
    torch::Tensor sum = held->second.back().clone();
    for (auto gradient = std::next(held->second.rbegin()); gradient != held->second.rend(); ++gradient) sum.add_(*gradient);
    parameter.grad().copy_(sum);
  }
  held_.clear();
}

namespace {

constexpr const char* kSharedWeight = "tok_embeddings.weight";

torch::Tensor SharedWeight(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters()) {
    if (item.key() == kSharedWeight) return item.value();
  }
  return {};
}

}  // namespace

torch::Tensor Faults::SharedWeightGradient(const torch::nn::Module& module) const {
  if (fault_ != Fault::kZbSharedWeightGradTwice) return {};
  const auto weight = SharedWeight(module);
  if (!weight.defined()) return {};
  return weight.grad().defined() ? weight.grad().detach().clone() : torch::zeros_like(weight);
}

void Faults::AfterWeightGradient(const torch::nn::Module& module, const torch::Tensor& before) const {
  if (fault_ != Fault::kZbSharedWeightGradTwice || !before.defined()) return;
  auto weight = SharedWeight(module);
  torch::NoGradGuard no_grad;
  weight.grad().add_(weight.grad() - before);  // this microbatch's contribution, once more
}

void Faults::BeforeAction(int rank, int world_size, int64_t step, int64_t steps, size_t index, size_t actions) const {
  if (fault_ != Fault::kCrashRank && fault_ != Fault::kHangRank && fault_ != Fault::kKilledRank) return;
  const int64_t fault_step = std::min<int64_t>(1, steps - 1);
  if (rank != world_size - 1 || step != fault_step || index != actions / 2) return;
  if (fault_ == Fault::kCrashRank) {
    fmt::print(stderr, "fault crash_rank: rank {} aborts in step {}\n", rank, step);
    std::abort();
  }
  if (fault_ == Fault::kKilledRank) {
    fmt::print(stderr, "fault killed_rank: rank {} gets SIGKILL in step {}\n", rank, step);
    std::fflush(stderr);
    raise(SIGKILL);
  }
  fmt::print(stderr, "fault hang_rank: rank {} stops making progress in step {}\n", rank, step);
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace pipecheck::pipeline
