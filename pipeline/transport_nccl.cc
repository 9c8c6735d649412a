// The nccl transport (see transport.h): CUDA tensors over c10d's ProcessGroupNCCL, one GPU per
// rank. NCCL matches a pair's messages by order, and a send or receive it has started holds its
// stream until the other end has started too. On one communicator a rank's messages to and from
// all peers would share one stream (c10d puts every coalesced group there), where a receive
// posted early waits ahead of sends the peer needs first: 1F1B deadlocks from two ranks on. So
// each ordered pair of ranks that exchanges messages gets a channel of its own, a two-rank
// ProcessGroupNCCL on which the first rank only sends and the second only receives, each with its
// own communicator and stream: a receive posted early holds only later messages from the same
// peer (the simulator's kDeviceStreams). Channels are made, and their communicators set up by a
// first message, before the first step and in one order on every rank (OpenChannels). Waiting for
// a message makes the current stream wait for it: the host does not. Headers travel ahead of
// payloads as on every transport (on Gloo, in the same buffer for a pipeline message); their tags
// and shapes are read off the device where the step's work is done (CheckReceived), not per
// message, which would stall the host on every receive.
// CPU tensors (the results sent to rank 0) go over a Gloo group; the clipping norm's gather and
// the barrier go over the whole group's communicator.
#include "pipeline/transport_parts.h"

#if PIPECHECK_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "reference/device.h"
#endif

namespace pipecheck::pipeline {

#if PIPECHECK_NCCL

bool NcclAvailable() { return true; }

namespace {

void WaitOn(const std::vector<compat::WorkHandle>& works) {
  for (const auto& work : works) work->wait();  // the current stream waits for the channel's; the host does not
}

class NcclSend : public PendingSend {
 public:
  NcclSend(std::vector<compat::WorkHandle> works, std::vector<torch::Tensor> buffers)
      : works_(std::move(works)), buffers_(std::move(buffers)) {}
  void Wait() override {
    WaitOn(works_);
    buffers_.clear();
  }

 private:
  std::vector<compat::WorkHandle> works_;
  std::vector<torch::Tensor> buffers_;
};

struct Unchecked {
  torch::Tensor header;  // on the host, copied from the device without waiting
  int peer = 0, tag = 0;
  std::optional<MessageShape> expected;
};

class NcclRecv : public PendingRecv {
 public:
  NcclRecv(std::vector<compat::WorkHandle> works, torch::Tensor header, torch::Tensor payload, int peer, int tag,
           std::optional<MessageShape> expected, std::vector<Unchecked>& unchecked)
      : works_(std::move(works)), header_(std::move(header)), payload_(std::move(payload)), peer_(peer), tag_(tag),
        expected_(std::move(expected)), unchecked_(unchecked) {}
  torch::Tensor Wait() override {
    WaitOn(works_);
    auto host = torch::empty(header_.sizes(), header_.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(header_, /*non_blocking=*/true);
    unchecked_.push_back({host, peer_, tag_, expected_});
    return payload_;
  }

 private:
  std::vector<compat::WorkHandle> works_;
  torch::Tensor header_, payload_;
  int peer_, tag_;
  std::optional<MessageShape> expected_;
  std::vector<Unchecked>& unchecked_;
};

using Channel = c10::intrusive_ptr<c10d::ProcessGroupNCCL>;

class NcclTransport : public Transport {
 public:
  NcclTransport(Channel nccl, c10::intrusive_ptr<c10d::Store> store, std::unique_ptr<Transport> host,
                const RendezvousOptions& options, torch::Device device)
      : nccl_(std::move(nccl)), store_(std::move(store)), host_(std::move(host)), rank_(options.rank),
        size_(options.world_size), timeout_(options.timeout), device_(device) {}

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void OpenChannels(const std::vector<std::pair<int, int>>& channels) override {
    host_->OpenChannels(channels);
    // In one order on every rank, each channel's ends meet once (NCCL sets up a communicator
    // with both ends present): the first channel not yet set up always has both ends at it.
    for (const auto& [from, to] : ChannelsOfRank(channels, rank_, size_)) {
      if (channels_.count({from, to}) > 0) continue;
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout_;
      const std::string prefix = "nccl-channel-" + std::to_string(from) + "-" + std::to_string(to);
      auto channel = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>(prefix, store_),
                                                                 rank_ == from ? 0 : 1, 2, options);
      std::vector<at::Tensor> token = {torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt32).device(device_))};
      auto work = rank_ == from ? channel->send(token, 1, 0) : channel->recv(token, 0, 0);
      work->wait();
      channels_.emplace(std::make_pair(from, to), std::move(channel));
    }
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
  }

  std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                    const std::optional<MessageShape>& announced) override {
    if (!tensor.is_cuda()) return host_->Send(tensor, peer, tag, announced);
    // Queued behind the work before it, not waited for (a blocking copy would stall the host).
    auto header = reference::ToDevice(
        MakeHeader(tag, announced ? *announced : MessageShape{tensor.scalar_type(), tensor.sizes().vec()}), device_);
    auto payload = tensor.detach().contiguous();
    auto& channel = ChannelOf(rank_, peer, tag);
    std::vector<compat::WorkHandle> works = {Issue(channel, header, /*send=*/true)};
    if (payload.numel() > 0) works.push_back(Issue(channel, payload, /*send=*/true));
    return std::make_unique<NcclSend>(std::move(works), std::vector<torch::Tensor>{header, payload});
  }

  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    if (!device.is_cuda()) return host_->Recv(peer, tag, device, expected);
    // The payload is posted with the header, so its size must come from the plan: reading the
    // header first would stall the host until the message arrived.
    TORCH_CHECK(expected, "the nccl transport receives CUDA messages of planned shapes only (", DescribeTag(tag), ")");
    auto header = torch::empty({kMessageHeaderBytes / 8}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
    auto payload = torch::empty(expected->sizes, torch::TensorOptions().dtype(expected->dtype).device(device_));
    auto& channel = ChannelOf(peer, rank_, tag);
    std::vector<compat::WorkHandle> works = {Issue(channel, header, /*send=*/false)};
    if (payload.numel() > 0) works.push_back(Issue(channel, payload, /*send=*/false));
    return std::make_unique<NcclRecv>(std::move(works), header, payload, peer, tag, expected, unchecked_);
  }

  std::vector<double> AllGather(double value) override {
    std::vector<at::Tensor> input = {torch::full({1}, value, torch::TensorOptions().dtype(torch::kFloat64).device(device_))};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < size_; ++r) output[0].push_back(torch::empty_like(input[0]));
    nccl_->allgather(output, input)->wait();
    const auto gathered = torch::cat(output[0]).cpu();  // waits for the device
    return std::vector<double>(gathered.data_ptr<double>(), gathered.data_ptr<double>() + size_);
  }

  void Barrier() override {
    std::vector<at::Tensor> token = {torch::ones({1}, torch::TensorOptions().dtype(torch::kInt32).device(device_))};
    nccl_->allreduce(token)->wait();
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
  }

  void CheckReceived() override {
    if (unchecked_.empty()) return;
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    auto pending = std::move(unchecked_);
    unchecked_.clear();
    for (const auto& message : pending) {
      CheckHeader(ReadHeader(message.header, message.peer), message.peer, rank_, message.tag, message.expected);
    }
  }

 private:
  Channel& ChannelOf(int from, int to, int tag) {
    auto found = channels_.find({from, to});
    TORCH_CHECK(found != channels_.end(), "rank ", rank_, ": ", DescribeTag(tag), " goes from rank ", from, " to rank ",
                to, ", a pair OpenChannels was not given (every rank must list every pair that carries messages)");
    return found->second;
  }

  // One send (to the channel's rank 1) or receive (from its rank 0), in the channel's order.
  static compat::WorkHandle Issue(Channel& channel, torch::Tensor tensor, bool send) {
    std::vector<at::Tensor> tensors = {std::move(tensor)};
    return send ? channel->send(tensors, 1, 0) : channel->recv(tensors, 0, 0);
  }

  Channel nccl_;  // the whole group: collectives
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Transport> host_;  // gloo, for CPU tensors
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  torch::Device device_;
  std::map<std::pair<int, int>, Channel> channels_;  // (from, to) -> its one-way channel
  std::vector<Unchecked> unchecked_;
};

}  // namespace

std::unique_ptr<Transport> MakeNcclTransport(const c10::intrusive_ptr<c10d::Store>& store,
                                             const RendezvousOptions& options, torch::Device device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "the nccl transport needs a CUDA device, not ", device.str());
  c10::cuda::set_device(device.index());
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store),
                                                          options.rank, options.world_size, nccl_options);
  auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("gloo", store);
  auto host = MakeGlooTransport(gloo_store, MakeGloo(gloo_store, options), options, /*staged=*/false);
  return std::make_unique<NcclTransport>(std::move(nccl), store, std::move(host), options, device);
}

#else  // no NCCL in this build

bool NcclAvailable() { return false; }

std::unique_ptr<Transport> MakeNcclTransport(const c10::intrusive_ptr<c10d::Store>& /*store*/,
                                             const RendezvousOptions& /*options*/, torch::Device device) {
  TORCH_CHECK(false, "this build has no nccl transport (its LibTorch has no CUDA or no c10d NCCL backend); rank on ",
              device.str());
}

#endif

}  // namespace pipecheck::pipeline
