// The nccl transport (see transport.h): CUDA tensors over c10d's ProcessGroupNCCL, one GPU per
// rank. NCCL matches a pair's messages by order on one stream per pair, and a receive it has
// started blocks that stream until its send arrives: the discipline's groups (one peer each,
// c10d coalescing, NCCL's grouped launch) are what keep two ranks that exchange from waiting on
// each other. Waiting for a message makes the current stream wait for it: the host does not.
// Headers travel ahead of payloads as on every transport; their tags and shapes are read off the
// device where the step's work is done (CheckReceived), not per message, which would stall the
// host on every receive. CPU tensors (the results sent to rank 0) go over a Gloo group; the
// clipping norm's gather and the barrier go over NCCL.
#include "pipeline/transport_parts.h"

#if PIPECHECK_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <vector>
#endif

namespace pipecheck::pipeline {

#if PIPECHECK_NCCL

bool NcclAvailable() { return true; }

namespace {

// A work handle that a group fills in when it is issued (ops inside a coalesced group have none
// of their own), shared by every message of the group.
using WorkSlot = std::shared_ptr<compat::WorkHandle>;

void WaitOn(const std::vector<WorkSlot>& slots) {
  for (const auto& slot : slots) {
    TORCH_CHECK(slot && *slot, "an nccl message is waited for before its group was issued");
    (*slot)->wait();  // the current stream waits for the NCCL stream; the host does not
  }
}

class NcclSend : public PendingSend {
 public:
  NcclSend(std::vector<WorkSlot> works, std::vector<torch::Tensor> buffers)
      : works_(std::move(works)), buffers_(std::move(buffers)) {}
  void Wait() override {
    WaitOn(works_);
    buffers_.clear();
  }

 private:
  std::vector<WorkSlot> works_;
  std::vector<torch::Tensor> buffers_;
};

struct Unchecked {
  torch::Tensor header;  // on the host, copied from the device without waiting
  int peer = 0, tag = 0;
  std::optional<MessageShape> expected;
};

class NcclRecv : public PendingRecv {
 public:
  NcclRecv(std::vector<WorkSlot> works, torch::Tensor header, torch::Tensor payload, int peer, int tag,
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
  std::vector<WorkSlot> works_;
  torch::Tensor header_, payload_;
  int peer_, tag_;
  std::optional<MessageShape> expected_;
  std::vector<Unchecked>& unchecked_;
};

class NcclTransport : public Transport {
 public:
  NcclTransport(c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl, std::unique_ptr<Transport> host,
                const RendezvousOptions& options, torch::Device device)
      : nccl_(std::move(nccl)), host_(std::move(host)), rank_(options.rank), size_(options.world_size),
        device_(device) {}

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void BeginGroup(int peer) override {
    group_check_.Begin(peer);
    host_->BeginGroup(peer);
    group_slots_.clear();
    grouped_ = false;
  }

  void EndGroup() override {
    group_check_.End();
    host_->EndGroup();
    if (grouped_) {
      auto work = nccl_->endCoalescing();
      for (auto& slot : group_slots_) *slot = work;
    }
    group_slots_.clear();
    grouped_ = false;
  }

  std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                    const std::optional<MessageShape>& announced) override {
    group_check_.Op(peer);
    if (!tensor.is_cuda()) return host_->Send(tensor, peer, tag, announced);
    auto header =
        MakeHeader(tag, announced ? *announced : MessageShape{tensor.scalar_type(), tensor.sizes().vec()}).to(device_);
    auto payload = tensor.detach().contiguous();
    std::vector<WorkSlot> works = {Issue(header, peer, /*send=*/true)};
    if (payload.numel() > 0) works.push_back(Issue(payload, peer, /*send=*/true));
    return std::make_unique<NcclSend>(std::move(works), std::vector<torch::Tensor>{header, payload});
  }

  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    group_check_.Op(peer);
    if (!device.is_cuda()) return host_->Recv(peer, tag, device, expected);
    // The payload is posted with the header, so its size must come from the plan: reading the
    // header first would stall the host until the message arrived.
    TORCH_CHECK(expected, "the nccl transport receives CUDA messages of planned shapes only (", DescribeTag(tag), ")");
    auto header = torch::empty({kMessageHeaderBytes / 8}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
    auto payload = torch::empty(expected->sizes, torch::TensorOptions().dtype(expected->dtype).device(device_));
    std::vector<WorkSlot> works = {Issue(header, peer, /*send=*/false)};
    if (payload.numel() > 0) works.push_back(Issue(payload, peer, /*send=*/false));
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
  // Issues one send or receive; inside a group it joins the coalesced launch, whose work handle
  // the group's EndGroup fills in.
  WorkSlot Issue(torch::Tensor tensor, int peer, bool send) {
    const bool in_group = group_check_.peer() >= 0;
    if (in_group && !grouped_) {
      nccl_->startCoalescing();
      grouped_ = true;
    }
    std::vector<at::Tensor> tensors = {std::move(tensor)};
    auto work = send ? nccl_->send(tensors, peer, 0) : nccl_->recv(tensors, peer, 0);
    auto slot = std::make_shared<compat::WorkHandle>(in_group ? compat::WorkHandle() : work);
    if (in_group) group_slots_.push_back(slot);
    return slot;
  }

  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_;
  std::unique_ptr<Transport> host_;  // gloo, for CPU tensors
  int rank_, size_;
  torch::Device device_;
  PeerGroupCheck group_check_;
  bool grouped_ = false;
  std::vector<WorkSlot> group_slots_;
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
  return std::make_unique<NcclTransport>(std::move(nccl), std::move(host), options, device);
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
