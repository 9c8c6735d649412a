// Point-to-point messages between ranks for the pipeline: every message is a small header
// (its tag, dtype, shape) followed by its payload, so variable sequence lengths just work.
//
// One discipline for every transport, NCCL's (docs/design.md §4): messages from one rank to
// another are matched by their order, not by their tag. The sender's k-th message to a peer is the
// peer's k-th receive from it, so both must post them in the same order (the simulator proves
// a schedule does). The tag names the message (direction, stage, microbatch) and travels in the
// header, where the receiver checks it: a message taken out of order is an error naming both,
// never a silent mix-up. Sends are asynchronous and receives are posted where the plan puts
// them (as early as it allows), so a rank waits only for a message it needs or for its previous
// send to the same peer and direction. On nccl, each ordered pair of ranks has a one-way channel
// of its own (a two-rank communicator and its streams), so a receive posted early holds only the
// messages behind it from that peer, never a send; the simulator checks every schedule under this
// (kDeviceStreams). Gloo and staged follow the same discipline, so the CPU tests exercise the
// order and the early receives NCCL relies on.
//
// Transports: gloo (CPU tensors), staged (CUDA tensors through pinned host memory over Gloo,
// for ranks that share a GPU), nccl (CUDA tensors over c10d's ProcessGroupNCCL, one GPU per
// rank; CPU tensors such as the final results still go over Gloo). On Gloo a pipeline message
// (an activation or a gradient) goes as one buffer, header and payload, received into the shape
// the receiver's plan gives (the payload lands while it computes) and copied out at its wait; the
// results (whose receiver knows no shape) and the tied gradient (one message a step) go as a
// header and then the payload the header sized. Not a collective library: only what the
// pipeline needs (a gather of one number per rank, a barrier).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/message.h"

namespace pipecheck::pipeline {

// Of the ordered pairs (from, to) every rank was given, those `rank` is an end of, sorted and each
// once: the order in which the nccl transport sets up its channels, the same relative order on
// both ends of each, so the first channel not yet set up always has both ends at it. Throws on
// a pair that is no pair of two ranks of `world_size`.
std::vector<std::pair<int, int>> ChannelsOfRank(const std::vector<std::pair<int, int>>& channels, int rank,
                                                int world_size);

class PendingSend {
 public:
  virtual ~PendingSend() = default;
  virtual void Wait() = 0;  // blocks until the payload has left this process's hands
};

class PendingRecv {
 public:
  virtual ~PendingRecv() = default;
  virtual torch::Tensor Wait() = 0;  // blocks until the whole message has arrived
};

// The header every message starts with: tag, dtype, number of dimensions and up to 8 sizes, int64.
constexpr int kMaxMessageDims = 8;
constexpr int64_t kMessageHeaderBytes = (3 + kMaxMessageDims) * 8;

// What a receiver expects a message to be.
struct MessageShape {
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> sizes;
  std::string ToString() const;  // "float32 (2, 16, 64)"
  bool operator==(const MessageShape& other) const { return dtype == other.dtype && sizes == other.sizes; }
  bool operator!=(const MessageShape& other) const { return !(*this == other); }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // gloo, staged, nccl; none at world size 1
  // Starts sending `tensor` to `peer`; the tensor is kept alive until the send completes. The
  // header states the tensor's own dtype and shape, or `announced` (only a fault lies so).
  virtual std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                            const std::optional<MessageShape>& announced) = 0;
  // An empty contiguous tensor like `like` (dtype, shape, device) that Send sends without copying
  // it; any other tensor is copied into such a buffer first (gloo, staged).
  virtual torch::Tensor SendBuffer(const torch::Tensor& like) {
    return torch::empty_like(like, torch::MemoryFormat::Contiguous);
  }
  // Posts a receive of a message from `peer`; the result lands on `device`. With `expected`,
  // the payload's receive is posted now as well, and a message of another shape is an error. On
  // Gloo an activation's or a gradient's receive needs `expected` (its buffer is sized by it) and
  // throws without it.
  virtual std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                            const std::optional<MessageShape>& expected) = 0;
  // Called by every rank before the first message, with the same list everywhere: the ordered
  // pairs (from, to) that will carry messages. nccl makes each pair's one-way channel now, in one
  // order on every rank, so no rank waits inside a step for a peer to set a channel up. A message
  // on a pair not listed is an error there; the other transports need nothing.
  virtual void OpenChannels(const std::vector<std::pair<int, int>>& /*channels*/) {}
  // Every rank's `value`, indexed by rank, identical on every rank (over the device group).
  virtual std::vector<double> AllGather(double value) = 0;
  virtual void Barrier() = 0;
  // Sums `tensor` elementwise over every rank of the group, in place; every rank ends with the
  // same bits (a data-parallel group's gradient bucket). Only the groups ConnectGroups makes for
  // data parallelism implement it.
  virtual void AllReduceSum(torch::Tensor& tensor) {
    TORCH_CHECK(false, "the ", name(), " transport has no all-reduce (only a data-parallel group does): ",
                tensor.numel(), " elements");
  }
  // Throws if a message received since the last call broke the discipline (headers a transport
  // could only read off the device later: nccl). Called where the step's work is done.
  virtual void CheckReceived() {}
};

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  bool serve_store = true;  // rank 0 serves the TCPStore; false when a launcher (torchrun's agent) does
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Connects to the TCPStore at master_addr:master_port (rank 0 serves it) and builds the process
// groups of transport `kind` (gloo, staged or nccl) for this rank's `device`. World size 1 gets
// a transport that refuses to send: the degenerate pipeline never communicates.
std::unique_ptr<Transport> Connect(const RendezvousOptions& options, const std::string& kind, torch::Device device);
std::unique_ptr<Transport> ConnectGloo(const RendezvousOptions& options);  // Connect(options, "gloo", cpu)

// The two groups a rank of a pipeline x data-parallel run belongs to. Of `options`' world_size
// processes (global ranks), global rank g is replica g / pipeline_size's pipeline rank
// g % pipeline_size. `pipeline` connects one replica's ranks (rank() = the pipeline rank) over
// transport `kind`; `data_parallel` connects the ranks of every replica at the same pipeline rank
// (rank() = the replica) over Gloo, CUDA tensors staged through host memory. Both over one
// TCPStore, each group under its own prefix. A group of one rank is a transport that refuses
// messages; with one replica, the pipeline group is exactly Connect's.
struct ProcessGroups {
  std::unique_ptr<Transport> pipeline;
  std::unique_ptr<Transport> data_parallel;
  int replica = 0;
  int pipeline_rank = 0;
};
ProcessGroups ConnectGroups(const RendezvousOptions& options, int pipeline_size, const std::string& kind,
                            torch::Device device);

// Whether this build has the nccl transport (a LibTorch with CUDA and c10d's NCCL backend).
bool NcclAvailable();

}  // namespace pipecheck::pipeline
