// Tied-gradient sums and global clipping (see gradient_sync.h).
#include "pipeline/gradient_sync.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "reference/gradient_accumulation.h"
#include "reference/optimizer.h"

namespace pipecheck::pipeline {

std::vector<std::pair<int, int>> TiedChannels(const PipelineConfig& config, const PipelineShape& shape) {
  const int first_rank = shape.RankOfStage(0), last_rank = shape.RankOfStage(shape.stages() - 1);
  if (!config.train.model.tied || first_rank == last_rank) return {};
  return {{first_rank, last_rank}, {last_rank, first_rank}};
}

void SyncTiedGradients(const Stages& stages, const PipelineConfig& config, const PipelineShape& shape,
                       Transport& transport) {
  const int num_stages = shape.stages();
  if (!config.train.model.tied || num_stages == 1) return;
  const int last = num_stages - 1;
  const int first_rank = shape.RankOfStage(0), last_rank = shape.RankOfStage(last);
  const int rank = transport.rank();
  auto gradient_of = [&](int stage) {
    auto gradient = StageAt(stages, stage, rank).module->named_parameters()["tok_embeddings.weight"].grad();
    TORCH_CHECK(gradient.defined(), "rank ", rank, ": tied weight of stage ", stage, " has no gradient");
    return gradient;
  };
  // Both owners compute first + last in the same order, so their sums are bitwise equal.
  if (first_rank == last_rank) {
    if (rank != first_rank) return;
    auto first = gradient_of(0), copy = gradient_of(last);
    auto sum = first + copy;
    first.copy_(sum);
    copy.copy_(sum);
    return;
  }
  if (rank != first_rank && rank != last_rank) return;
  const bool is_first = rank == first_rank;
  const int own_stage = is_first ? 0 : last, peer_stage = is_first ? last : 0;
  const int peer = is_first ? last_rank : first_rank;
  auto own = gradient_of(own_stage);
  // Both post the receive before the send: neither waits for the other to receive first.
  auto receive = transport.Recv(peer, MessageTag(Direction::kTiedGradient, peer_stage, 0), own.device(),
                                MessageShape{own.scalar_type(), own.sizes().vec()});
  auto send = transport.Send(own, peer, MessageTag(Direction::kTiedGradient, own_stage, 0), std::nullopt);
  auto other = receive->Wait();
  send->Wait();
  transport.CheckReceived();
  auto sum = is_first ? own + other : other + own;
  own.copy_(sum);
}

namespace {

// One bucket's average: `gradients` (one dtype) flattened into `bucket`, summed (the loss holds the
// 1 / replicas), copied back.
void AverageBucket(const std::vector<torch::Tensor>& gradients, Transport& replicas, torch::Tensor& bucket,
                   ReplicaTraffic& traffic) {
  std::vector<torch::Tensor> flat;
  int64_t elements = 0;
  for (const auto& gradient : gradients) {
    flat.push_back(gradient.reshape({-1}));
    elements += gradient.numel();
  }
  if (!bucket.defined() || bucket.numel() != elements || bucket.device() != gradients.front().device()) {
    bucket = torch::empty({elements}, gradients.front().options());
  }
  torch::cat_out(bucket, flat);
  replicas.AllReduceSum(bucket);
  int64_t offset = 0;
  for (const auto& gradient : gradients) {
    gradient.copy_(bucket.narrow(0, offset, gradient.numel()).view(gradient.sizes()));
    offset += gradient.numel();
  }
  traffic.elements += elements;
  traffic.bytes += elements * static_cast<int64_t>(bucket.element_size());
}

}  // namespace

ReplicaTraffic AverageAcrossReplicas(const std::vector<torch::Tensor>& parameters,
                                     const std::vector<torch::Tensor>& alone, Transport& replicas,
                                     ReplicaBuckets& persistent, bool sparse, bool unrouted_skipped) {
  ReplicaTraffic traffic;
  std::map<torch::ScalarType, std::vector<torch::Tensor>> shared;
  std::vector<torch::Tensor> own;
  std::vector<bool> anywhere(parameters.size(), true);
  std::vector<bool> here(parameters.size(), true);
  if (sparse) {
    auto held = torch::zeros({static_cast<int64_t>(parameters.size())}, torch::kFloat64);
    for (size_t i = 0; i < parameters.size(); ++i) held[static_cast<int64_t>(i)] = parameters[i].grad().defined() ? 1.0 : 0.0;
    replicas.AllReduceSum(held);
    for (size_t i = 0; i < parameters.size(); ++i) {
      anywhere[i] = held[static_cast<int64_t>(i)].item<double>() > 0.0;
      auto parameter = parameters[i];
      here[i] = parameter.grad().defined();
      if (!parameter.grad().defined()) {
        // Zeros in the dtype the replicas that have one hold it in (reduced precision: float32
        // sums), so that every replica's buckets hold the same tensors, as DDP's do.
        const auto dtype = reference::AccumulatesInFloat32(parameter.scalar_type()) ? torch::kFloat32 : parameter.scalar_type();
        parameter.mutable_grad() = torch::zeros_like(parameter, parameter.options().dtype(dtype));
      }
    }
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& parameter = parameters[i];
    const auto gradient = parameter.grad();
    TORCH_CHECK(gradient.defined(), "a parameter of shape ", parameter.sizes(), " has no gradient to average across ",
                replicas.world_size(), " replicas");
    const bool by_itself =
        std::any_of(alone.begin(), alone.end(), [&](const torch::Tensor& t) { return t.is_same(parameter); });
    if (by_itself) {
      own.push_back(gradient);
    } else {
      shared[gradient.scalar_type()].push_back(gradient);
    }
  }
  for (auto& [dtype, gradients] : shared) {
    AverageBucket(gradients, replicas, persistent[std::string("bucket ") + c10::toString(dtype)], traffic);
  }
  for (size_t i = 0; i < own.size(); ++i) {
    AverageBucket({own[i]}, replicas, persistent["alone " + std::to_string(i)], traffic);
  }
  // What no replica's tokens reached has no gradient after the average either.
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!anywhere[i] || (unrouted_skipped && !here[i])) parameters[i].mutable_grad().reset();
  }
  return traffic;
}

std::vector<torch::Tensor> TiedCopies(const Stages& stages, const PipelineConfig& config) {
  std::vector<torch::Tensor> copies;
  if (!config.train.model.tied) return copies;
  for (const auto& stage : stages) {
    if (!stage->slice.has_embedding && !stage->slice.has_head) continue;
    for (const auto& item : stage->module->named_parameters()) {
      if (item.key() == "tok_embeddings.weight") copies.push_back(item.value());
    }
  }
  return copies;
}

double ClipGradients(const Stages& stages, const PipelineConfig& config, const GradientStage& clip, Transport& transport) {
  const bool tied = config.train.model.tied;
  const double local = reference::GradSquaredSum(OwnedParameters(stages, tied, clip.tied_copy_in_norm));
  double total = 0.0;
  for (double part : transport.AllGather(local)) total += part;  // rank order: identical everywhere
  if (!clip.global_norm) total = local;
  const double norm = std::sqrt(total);
  reference::ScaleGradients(OwnedParameters(stages, tied, /*count_tied_copy=*/true),
                            reference::ClipFactor(norm, config.train.clip));
  return norm;
}

}  // namespace pipecheck::pipeline
