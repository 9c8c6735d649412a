// Point-to-point messages between ranks for the pipeline: every message is a small header
// (dtype, shape) followed by its payload, so variable sequence lengths just work. A receiver
// that knows the shape from its plan posts header and payload at once (the payload can land
// while it computes) and the header then checks the plan; one that does not posts the payload
// once the header has told it the shape. Tags name (direction, stage, microbatch), so two
// messages between the same two ranks are never confused. Gloo over c10d now; NCCL later
// behind the same interface. Not a collective library: only the two collectives the pipeline
// needs (a gather of one number per rank, a barrier).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pipecheck::pipeline {

enum class Direction { kActivation = 0, kGradient = 1, kTiedGradient = 2, kResult = 3 };

// A tag unique per (direction, stage, microbatch); stages < 1024, microbatches < 65536.
int MessageTag(Direction direction, int stage, int microbatch);

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

// The header every message starts with: dtype, number of dimensions and up to 8 sizes, int64.
constexpr int kMaxMessageDims = 8;
constexpr int64_t kMessageHeaderBytes = (2 + kMaxMessageDims) * 8;

// What a receiver expects a message to be.
struct MessageShape {
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> sizes;
  std::string ToString() const;  // "float32 (2, 16, 64)"
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Starts sending `tensor` to `peer`; the tensor is kept alive until the send completes. The
  // header states the tensor's own dtype and shape, or `announced` (only a fault lies so).
  virtual std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                            const std::optional<MessageShape>& announced) = 0;
  // Posts a receive of a message from `peer`; the result lands on `device`. With `expected`,
  // the payload's receive is posted now as well, and a message of another shape is an error.
  virtual std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                            const std::optional<MessageShape>& expected) = 0;
  // Every rank's `value`, indexed by rank, identical on every rank.
  virtual std::vector<double> AllGather(double value) = 0;
  virtual void Barrier() = 0;
};

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  bool serve_store = true;  // rank 0 serves the TCPStore; false when a launcher (torchrun's agent) does
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Connects to the TCPStore at master_addr:master_port (rank 0 serves it) and builds a Gloo
// process group. World size 1 gets a transport that refuses to send: the degenerate pipeline
// never communicates.
std::unique_ptr<Transport> ConnectGloo(const RendezvousOptions& options);

}  // namespace pipecheck::pipeline
