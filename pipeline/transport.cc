// Header-then-payload P2P over c10d Gloo (see transport.h).
#include "pipeline/transport.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pipeline/c10d_compat.h"

namespace pipecheck::pipeline {
namespace {

constexpr int kMaxDims = kMaxMessageDims;
constexpr int kHeaderSize = kMessageHeaderBytes / 8;  // int64: dtype, ndim, sizes...

// (kHeaderSize) int64: dtype code, number of dimensions, sizes.
torch::Tensor MakeHeader(const MessageShape& shape) {
  const int64_t dims = static_cast<int64_t>(shape.sizes.size());
  TORCH_CHECK(dims <= kMaxDims, "cannot send a tensor of ", dims, " dimensions (at most ", kMaxDims, ")");
  auto header = torch::zeros({kHeaderSize}, torch::kInt64);
  auto values = header.accessor<int64_t, 1>();
  values[0] = static_cast<int64_t>(shape.dtype);
  values[1] = dims;
  for (int64_t d = 0; d < dims; ++d) values[2 + d] = shape.sizes[d];
  return header;
}

class GlooSend : public PendingSend {
 public:
  GlooSend(compat::WorkHandle header, compat::WorkHandle payload, std::vector<torch::Tensor> buffers)
      : header_(std::move(header)), payload_(std::move(payload)), buffers_(std::move(buffers)) {}
  void Wait() override {
    header_->wait();
    if (payload_) payload_->wait();
    buffers_.clear();
  }

 private:
  compat::WorkHandle header_, payload_;
  std::vector<torch::Tensor> buffers_;  // alive until sent
};

class GlooRecv : public PendingRecv {
 public:
  GlooRecv(compat::GlooGroup group, int peer, int tag, torch::Device device, const std::optional<MessageShape>& expected)
      : group_(std::move(group)), peer_(peer), tag_(tag), device_(device), expected_(expected) {
    header_buffer_ = {torch::empty({kHeaderSize}, torch::kInt64)};
    header_ = group_->recv(header_buffer_, peer_, 2 * tag_);
    if (expected_) PostPayload(expected_->dtype, expected_->sizes);
  }

  torch::Tensor Wait() override {
    header_->wait();
    auto values = header_buffer_[0].accessor<int64_t, 1>();
    const int64_t dims = values[1];
    TORCH_CHECK(dims >= 0 && dims <= kMaxDims, "corrupt message header from rank ", peer_, " (tag ", tag_, "): ",
                dims, " dimensions");
    const MessageShape got{static_cast<torch::ScalarType>(values[0]),
                           std::vector<int64_t>(values.data() + 2, values.data() + 2 + dims)};
    if (expected_) {
      // The payload receive is already posted with the planned size: a message of another size
      // would be cut or hang, so the header is the check.
      TORCH_CHECK(got.dtype == expected_->dtype && got.sizes == expected_->sizes, "message from rank ", peer_,
                  " (tag ", tag_, ") is ", got.ToString(), " but the plan expects ", expected_->ToString());
    } else {
      PostPayload(got.dtype, got.sizes);
    }
    if (payload_work_) payload_work_->wait();
    return payload_[0].to(device_);
  }

 private:
  void PostPayload(torch::ScalarType dtype, const std::vector<int64_t>& sizes) {
    payload_ = {torch::empty(sizes, torch::TensorOptions().dtype(dtype))};
    if (payload_[0].numel() > 0) payload_work_ = group_->recv(payload_, peer_, 2 * tag_ + 1);
  }

  compat::GlooGroup group_;
  int peer_, tag_;
  torch::Device device_;
  std::optional<MessageShape> expected_;
  std::vector<torch::Tensor> header_buffer_, payload_;
  compat::WorkHandle header_, payload_work_;
};

class GlooTransport : public Transport {
 public:
  GlooTransport(c10::intrusive_ptr<c10d::Store> store, compat::GlooGroup group, int rank, int size)
      : store_(std::move(store)), group_(std::move(group)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                    const std::optional<MessageShape>& announced) override {
    // Gloo sends CPU memory; a CUDA tensor would go through NCCL instead (a later transport).
    std::vector<torch::Tensor> header = {MakeHeader(announced ? *announced
                                                              : MessageShape{tensor.scalar_type(), tensor.sizes().vec()})};
    std::vector<torch::Tensor> payload = {tensor.detach().cpu().contiguous()};
    auto header_work = group_->send(header, peer, 2 * tag);
    compat::WorkHandle payload_work;
    if (payload[0].numel() > 0) payload_work = group_->send(payload, peer, 2 * tag + 1);
    return std::make_unique<GlooSend>(header_work, payload_work, std::vector<torch::Tensor>{header[0], payload[0]});
  }

  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    return std::make_unique<GlooRecv>(group_, peer, tag, device, expected);
  }

  std::vector<double> AllGather(double value) override {
    std::vector<torch::Tensor> input = {torch::full({1}, value, torch::kFloat64)};
    std::vector<std::vector<torch::Tensor>> output(1);
    for (int r = 0; r < size_; ++r) output[0].push_back(torch::empty({1}, torch::kFloat64));
    group_->allgather(output, input)->wait();
    std::vector<double> values;
    for (const auto& t : output[0]) values.push_back(t.item<double>());
    return values;
  }

  void Barrier() override { group_->barrier()->wait(); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  compat::GlooGroup group_;
  int rank_, size_;
};

// World size 1: no peers, so any send or receive is a bug in the caller.
class SoloTransport : public Transport {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::unique_ptr<PendingSend> Send(const torch::Tensor&, int peer, int tag, const std::optional<MessageShape>&) override {
    TORCH_CHECK(false, "world size 1 has no peer to send to (peer ", peer, ", tag ", tag, ")");
  }
  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device, const std::optional<MessageShape>&) override {
    TORCH_CHECK(false, "world size 1 has no peer to receive from (peer ", peer, ", tag ", tag, ")");
  }
  std::vector<double> AllGather(double value) override { return {value}; }
  void Barrier() override {}
};

bool IsLoopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

// The local address this host uses to reach `host` (what a peer on another machine can connect
// back to): the source address the kernel picks for a UDP socket "connected" there. Nothing is
// sent. Empty when it cannot be found.
std::string LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) return "";
  std::string address;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      address = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return address;
}

}  // namespace

std::string MessageShape::ToString() const {
  return fmt::format("{} ({})", c10::toString(dtype), fmt::join(sizes, ", "));
}

int MessageTag(Direction direction, int stage, int microbatch) {
  TORCH_CHECK(stage >= 0 && stage < 1024 && microbatch >= 0 && microbatch < 65536, "no tag for stage ", stage,
              " microbatch ", microbatch);
  return (static_cast<int>(direction) * 1024 + stage) * 65536 + microbatch;
}

std::unique_ptr<Transport> ConnectGloo(const RendezvousOptions& options) {
  if (options.world_size == 1) return std::make_unique<SoloTransport>();
  TORCH_CHECK(options.master_port > 0 && options.master_port < 65536, "MASTER_PORT ", options.master_port,
              " is not a port");
  auto store = compat::MakeTcpStore(options.master_addr, static_cast<uint16_t>(options.master_port),
                                    options.rank == 0 && options.serve_store, options.world_size, options.timeout);
  // Gloo's own default (the address the hostname resolves to) is often 127.0.1.1 on Debian, which
  // a peer on another host cannot reach: use the address that faces the rendezvous host.
  const std::string device_host =
      IsLoopback(options.master_addr) ? "127.0.0.1" : LocalAddressToward(options.master_addr, options.master_port);
  auto group = compat::MakeGlooGroup(store, options.rank, options.world_size, device_host, options.timeout);
  return std::make_unique<GlooTransport>(store, group, options.rank, options.world_size);
}

}  // namespace pipecheck::pipeline
