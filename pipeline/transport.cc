// Header-and-payload P2P over c10d Gloo (see transport.h).
#include "pipeline/transport.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Logging.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "pipeline/c10d_compat.h"
#include "pipeline/transport_parts.h"
#include "reference/dtype_name.h"

namespace pipecheck::pipeline {

MessageHeader ReadHeader(const torch::Tensor& header, int peer) {
  TORCH_CHECK(header.numel() == kMessageHeaderBytes / 8, "a message header from rank ", peer, " has ", header.numel(),
              " fields");
  const auto cpu = header.cpu();
  const auto values = cpu.accessor<int64_t, 1>();
  const int64_t dims = values[2];
  TORCH_CHECK(dims >= 0 && dims <= kMaxMessageDims, "corrupt message header from rank ", peer, " (",
              DescribeTag(static_cast<int>(values[0])), "): ", dims, " dimensions");
  return {static_cast<int>(values[0]),
          MessageShape{static_cast<torch::ScalarType>(values[1]),
                       std::vector<int64_t>(values.data() + 3, values.data() + 3 + dims)}};
}

namespace {

// The header's fields into `fields` (kMessageHeaderBytes of them, unused sizes zero).
void WriteHeader(int64_t* fields, int tag, const MessageShape& shape) {
  const int64_t dims = static_cast<int64_t>(shape.sizes.size());
  TORCH_CHECK(dims <= kMaxMessageDims, "cannot send a tensor of ", dims, " dimensions (at most ", kMaxMessageDims, ")");
  std::fill(fields, fields + kMessageHeaderBytes / 8, int64_t{0});
  fields[0] = tag;
  fields[1] = static_cast<int64_t>(shape.dtype);
  fields[2] = dims;
  for (int64_t d = 0; d < dims; ++d) fields[3 + d] = shape.sizes[d];
}

// Pipeline messages (activations, gradients) travel whole: header and payload in one buffer,
// received into the planned shape. The rest (results, whose receiver knows no shape, and the
// tied gradient, one message a step) as a header, then the payload the header sized.
bool TravelsWhole(int tag) {
  const Direction direction = DecodeTag(tag).direction;
  return direction == Direction::kActivation || direction == Direction::kGradient;
}

}  // namespace

torch::Tensor MakeHeader(int tag, const MessageShape& shape) {
  auto header = torch::empty({kMessageHeaderBytes / 8}, torch::kInt64);
  WriteHeader(header.data_ptr<int64_t>(), tag, shape);
  return header;
}

void CheckHeader(const MessageHeader& got, int peer, int rank, int tag, const std::optional<MessageShape>& expected) {
  TORCH_CHECK(got.tag == tag, "rank ", rank, ": the next message from rank ", peer, " is ", DescribeTag(got.tag),
              " but this receive is for ", DescribeTag(tag),
              ": messages between two ranks are matched by order, and the two ranks posted them in different orders");
  // A receive posted with the planned size would cut or hang on a message of another size, so
  // the header is the check.
  TORCH_CHECK(!expected || got.shape == *expected,
              "message from rank ", peer, " (", DescribeTag(tag), ") is ", got.shape.ToString(),
              " but the plan expects ", expected ? expected->ToString() : std::string());
}

std::vector<std::pair<int, int>> ChannelsOfRank(const std::vector<std::pair<int, int>>& channels, int rank,
                                                int world_size) {
  std::vector<std::pair<int, int>> mine;
  for (const auto& [from, to] : channels) {
    TORCH_CHECK(from != to && from >= 0 && to >= 0 && from < world_size && to < world_size,
                "no channel can run from rank ", from, " to rank ", to, " in a group of ", world_size);
    if (from == rank || to == rank) mine.emplace_back(from, to);
  }
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  return mine;
}

namespace {

// c10d tags of the Gloo channels: every message between two ranks goes on the same one or two
// (a pipeline message, header and payload in one buffer, on the first; any other, its header on
// the first and its payload on the second), so Gloo matches them by order as NCCL does (the
// message's own tag is checked in its header).
constexpr int kHeaderTag = 0;
constexpr int kPayloadTag = 1;

int64_t PayloadBytes(const MessageShape& shape) {
  return static_cast<int64_t>(c10::elementSize(shape.dtype)) * c10::multiply_integers(shape.sizes);
}

// A message's whole buffer: the header's bytes, then the payload's, one uint8 CPU tensor.
torch::Tensor WholeBuffer(int64_t payload_bytes, bool pinned) {
  return torch::empty({kMessageHeaderBytes + payload_bytes},
                      torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(pinned));
}

// The payload part of a whole buffer, as a tensor of `shape` (a view: no copy).
torch::Tensor PayloadOf(const torch::Tensor& whole, const MessageShape& shape) {
  return whole.narrow(0, kMessageHeaderBytes, whole.numel() - kMessageHeaderBytes).view(shape.dtype).view(shape.sizes);
}

// The whole buffer `tensor` is the payload of (SendBuffer's layout: a contiguous CPU tensor that
// starts right after kMessageHeaderBytes of its storage and ends with it), or an undefined one.
torch::Tensor WholeAround(const torch::Tensor& tensor) {
  if (tensor.is_cuda() || !tensor.is_contiguous() || !tensor.has_storage()) return {};
  const auto& storage = tensor.storage();
  const int64_t offset = tensor.storage_offset() * static_cast<int64_t>(tensor.element_size());
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  if (offset != kMessageHeaderBytes || static_cast<int64_t>(storage.nbytes()) != kMessageHeaderBytes + bytes) return {};
  return torch::empty({0}, tensor.options().dtype(torch::kUInt8))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
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
  GlooRecv(compat::GlooGroup group, int rank, int peer, int tag, torch::Device device, bool staged,
           const std::optional<MessageShape>& expected)
      : group_(std::move(group)), rank_(rank), peer_(peer), tag_(tag), device_(device), staged_(staged),
        expected_(expected) {
    if (TravelsWhole(tag_)) {
      // A pipeline message: one buffer of the header and the planned payload. A shorter message
      // lands and fails the header's check; a longer one would abort Gloo, which the sender's plan
      // check (the executor's) rules out.
      TORCH_CHECK(expected_, "rank ", rank_, ": the receive of ", DescribeTag(tag_), " from rank ", peer_,
                  " needs its planned shape (a pipeline message travels as one buffer of its header and payload)");
      whole_ = {WholeBuffer(PayloadBytes(*expected_), staged_)};
      header_ = group_->recv(whole_, peer_, kHeaderTag);
      return;
    }
    header_buffer_ = {torch::empty({kMessageHeaderBytes / 8}, torch::kInt64)};
    header_ = group_->recv(header_buffer_, peer_, kHeaderTag);
    if (expected_) PostPayload(expected_->dtype, expected_->sizes);
  }

  torch::Tensor Wait() override {
    if (!whole_.empty()) return WaitWhole();
    header_->wait();
    const MessageHeader got = ReadHeader(header_buffer_[0], peer_);
    CheckHeader(got, peer_, rank_, tag_, expected_);
    if (!expected_) PostPayload(got.shape.dtype, got.shape.sizes);
    if (payload_work_) payload_work_->wait();
    // staged: from pinned memory, queued on the device's stream (the host buffer is kept by
    // the caching host allocator until the copy is done).
    return payload_[0].to(device_, /*non_blocking=*/staged_);
  }

 private:
  // The payload is copied out of the whole buffer, which goes at once: what the stage keeps is the
  // payload alone, as a two-part message's is (staged: the device copy is the payload's own).
  torch::Tensor WaitWhole() {
    header_->wait();
    const auto whole = std::move(whole_[0]);
    whole_.clear();
    const MessageHeader got = ReadHeader(whole.narrow(0, 0, kMessageHeaderBytes).view(torch::kInt64), peer_);
    CheckHeader(got, peer_, rank_, tag_, expected_);
    const auto payload = PayloadOf(whole, *expected_);
    return device_.is_cpu() ? payload.clone() : payload.to(device_, /*non_blocking=*/staged_);
  }

  void PostPayload(torch::ScalarType dtype, const std::vector<int64_t>& sizes) {
    payload_ = {torch::empty(sizes, torch::TensorOptions().dtype(dtype).pinned_memory(staged_))};
    if (payload_[0].numel() > 0) payload_work_ = group_->recv(payload_, peer_, kPayloadTag);
  }

  compat::GlooGroup group_;
  int rank_, peer_, tag_;
  torch::Device device_;
  bool staged_;
  std::optional<MessageShape> expected_;
  std::vector<torch::Tensor> header_buffer_, payload_, whole_;
  compat::WorkHandle header_, payload_work_;  // header_: the whole message's, for a pipeline message
};

// gloo, and staged: CUDA tensors through pinned host memory.
class GlooTransport : public Transport {
 public:
  GlooTransport(c10::intrusive_ptr<c10d::Store> store, compat::GlooGroup group, int rank, int size, bool staged)
      : store_(std::move(store)), group_(std::move(group)), rank_(rank), size_(size), staged_(staged) {}

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string name() const override { return staged_ ? "staged" : "gloo"; }

  std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                    const std::optional<MessageShape>& announced) override {
    TORCH_CHECK(staged_ || !tensor.is_cuda(), "the gloo transport cannot send CUDA tensors (", DescribeTag(tag),
                "): use staged or nccl");
    const MessageShape stated = announced ? *announced : MessageShape{tensor.scalar_type(), tensor.sizes().vec()};
    if (TravelsWhole(tag)) return SendWhole(tensor, peer, tag, stated);
    std::vector<torch::Tensor> header = {MakeHeader(tag, stated)};
    torch::Tensor payload;
    if (tensor.is_cuda()) {
      // staged: copied out to pinned host memory now (the copy waits for the device's work on it).
      payload = torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(true));
      payload.copy_(tensor.detach());
    } else {
      payload = tensor.detach().contiguous();
    }
    std::vector<torch::Tensor> payloads = {payload};
    auto header_work = group_->send(header, peer, kHeaderTag);
    compat::WorkHandle payload_work;
    if (payload.numel() > 0) payload_work = group_->send(payloads, peer, kPayloadTag);
    return std::make_unique<GlooSend>(header_work, payload_work, std::vector<torch::Tensor>{header[0], payload});
  }

  // SendWhole's layout, so a tensor made here goes without a copy (pinned for staged). Its storage
  // is recorded: only a recorded one is written in place (a view of someone else's storage can
  // have the same layout, and its first bytes are not the transport's to overwrite).
  torch::Tensor SendBuffer(const torch::Tensor& like) override {
    if (like.is_cuda()) return torch::empty_like(like, torch::MemoryFormat::Contiguous);
    const MessageShape shape{like.scalar_type(), like.sizes().vec()};
    auto whole = WholeBuffer(PayloadBytes(shape), staged_);
    ForgetFreedSendBuffers();
    send_buffers_.push_back(whole.storage().getWeakStorageImpl());
    return PayloadOf(whole, shape);
  }

  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override {
    TORCH_CHECK(staged_ || !device.is_cuda(), "the gloo transport cannot receive onto ", device.str(),
                " (", DescribeTag(tag), "): use staged or nccl");
    return std::make_unique<GlooRecv>(group_, rank_, peer, tag, device, staged_ && device.is_cuda(), expected);
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
  // A pipeline message goes as one Gloo message, its header and payload in one buffer: half the
  // messages of a header and a payload apart, each a round of Gloo's ready notices between the
  // two ranks. The payload is copied in, unless `tensor` is already the payload of such a buffer
  // (SendBuffer's), whose header bytes are written in place.
  std::unique_ptr<PendingSend> SendWhole(const torch::Tensor& tensor, int peer, int tag, const MessageShape& stated) {
    torch::Tensor whole = FromSendBuffer(tensor) ? WholeAround(tensor) : torch::Tensor();
    if (!whole.defined()) {
      whole = WholeBuffer(static_cast<int64_t>(tensor.nbytes()), /*pinned=*/tensor.is_cuda());
      if (tensor.numel() > 0) PayloadOf(whole, {tensor.scalar_type(), tensor.sizes().vec()}).copy_(tensor.detach());
    }
    WriteHeader(reinterpret_cast<int64_t*>(whole.data_ptr<uint8_t>()), tag, stated);
    std::vector<torch::Tensor> buffer = {whole};
    auto work = group_->send(buffer, peer, kHeaderTag);
    return std::make_unique<GlooSend>(work, nullptr, std::vector<torch::Tensor>{whole});
  }

  // Whether `tensor`'s storage is one SendBuffer made and is still alive.
  bool FromSendBuffer(const torch::Tensor& tensor) {
    if (send_buffers_.empty() || !tensor.has_storage()) return false;
    ForgetFreedSendBuffers();
    const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    return std::any_of(send_buffers_.begin(), send_buffers_.end(),
                       [&](const auto& made) { return made.lock().get() == storage; });
  }

  void ForgetFreedSendBuffers() {
    send_buffers_.erase(std::remove_if(send_buffers_.begin(), send_buffers_.end(),
                                       [](const auto& made) { return made.expired(); }),
                        send_buffers_.end());
  }

 public:
  // Gloo's ring all-reduce: each chunk is summed on one rank and copied to the others, so every
  // rank gets the same bits. CUDA tensors (staged) go through host memory.
  void AllReduceSum(torch::Tensor& tensor) override {
    TORCH_CHECK(tensor.is_contiguous(), "all-reduce needs a contiguous tensor");
    std::vector<torch::Tensor> buffer = {tensor.is_cuda() ? tensor.cpu() : tensor};
    group_->allreduce(buffer)->wait();
    if (tensor.is_cuda()) tensor.copy_(buffer[0]);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  compat::GlooGroup group_;
  int rank_, size_;
  bool staged_;
  // SendBuffer's storages, held weakly: a record lapses with its storage (and, held, its address
  // cannot be reused by another storage while the record is kept).
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> send_buffers_;
};

// World size 1: no peers, so any send or receive is a bug in the caller.
class SoloTransport : public Transport {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "none"; }
  std::unique_ptr<PendingSend> Send(const torch::Tensor&, int peer, int tag, const std::optional<MessageShape>&) override {
    TORCH_CHECK(false, "world size 1 has no peer to send to (peer ", peer, ", tag ", tag, ")");
  }
  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device, const std::optional<MessageShape>&) override {
    TORCH_CHECK(false, "world size 1 has no peer to receive from (peer ", peer, ", tag ", tag, ")");
  }
  std::vector<double> AllGather(double value) override { return {value}; }
  void Barrier() override {}
  void AllReduceSum(torch::Tensor& /*tensor*/) override {}  // the sum over one rank
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
  return fmt::format("{} ({})", reference::DtypeName(dtype), fmt::join(sizes, ", "));
}

compat::GlooGroup MakeGloo(const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& options) {
  // Gloo's own default (the address the hostname resolves to) is often 127.0.1.1 on Debian, which
  // a peer on another host cannot reach: use the address that faces the rendezvous host.
  const std::string device_host =
      IsLoopback(options.master_addr) ? "127.0.0.1" : LocalAddressToward(options.master_addr, options.master_port);
  return compat::MakeGlooGroup(store, options.rank, options.world_size, device_host, options.timeout);
}

std::unique_ptr<Transport> MakeGlooTransport(c10::intrusive_ptr<c10d::Store> store, compat::GlooGroup group,
                                             const RendezvousOptions& options, bool staged) {
  return std::make_unique<GlooTransport>(std::move(store), std::move(group), options.rank, options.world_size,
                                         staged);
}

namespace {

void CheckTransportKind(const std::string& kind, torch::Device device) {
  TORCH_CHECK(kind == "gloo" || kind == "staged" || kind == "nccl", "unknown transport '", kind,
              "' (gloo, staged, nccl)");
  TORCH_CHECK(kind == "gloo" || device.is_cuda(), "the ", kind, " transport moves CUDA tensors, but this rank runs on ",
              device.str());
  TORCH_CHECK(kind != "gloo" || !device.is_cuda(), "the gloo transport cannot move CUDA tensors (", device.str(),
              "): use staged or nccl");
}

// c10's log threshold raised to FATAL while it lives. The TCPStore logs every failed connection
// attempt with its C++ stack (about 20 lines a try) before it throws; the rendezvous reports a
// failure itself, in one line that names what never answered, so those logs are only noise.
class QuietC10Logs {
 public:
  QuietC10Logs() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }  // FATAL
  ~QuietC10Logs() { FLAGS_caffe2_log_level = saved_; }
  QuietC10Logs(const QuietC10Logs&) = delete;
  QuietC10Logs& operator=(const QuietC10Logs&) = delete;

 private:
  int saved_;
};

// The run's TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it unless a launcher's agent does).
c10::intrusive_ptr<c10d::Store> RendezvousStore(const RendezvousOptions& options) {
  TORCH_CHECK(options.master_port > 0 && options.master_port < 65536, "MASTER_PORT ", options.master_port,
              " is not a port");
  const QuietC10Logs quiet;
  return compat::MakeTcpStore(options.master_addr, static_cast<uint16_t>(options.master_port),
                              options.rank == 0 && options.serve_store, options.world_size, options.timeout);
}

// Transport `kind` (CheckTransportKind's) for `options`' rank of a group of several ranks over `store`.
std::unique_ptr<Transport> TransportOver(const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& options,
                                         const std::string& kind, torch::Device device) {
  if (kind == "nccl") return MakeNcclTransport(store, options, device);
  return MakeGlooTransport(store, MakeGloo(store, options), options, kind == "staged");
}

}  // namespace

std::unique_ptr<Transport> Connect(const RendezvousOptions& options, const std::string& kind, torch::Device device) {
  if (options.world_size == 1) return std::make_unique<SoloTransport>();
  CheckTransportKind(kind, device);
  return TransportOver(RendezvousStore(options), options, kind, device);
}

ProcessGroups ConnectGroups(const RendezvousOptions& options, int pipeline_size, const std::string& kind,
                            torch::Device device) {
  TORCH_CHECK(pipeline_size >= 1 && options.world_size % pipeline_size == 0, "a run of ", options.world_size,
              " processes cannot hold whole pipelines of ", pipeline_size, " ranks");
  ProcessGroups groups;
  groups.replica = options.rank / pipeline_size;
  groups.pipeline_rank = options.rank % pipeline_size;
  const int replicas = options.world_size / pipeline_size;
  if (replicas == 1) {
    groups.pipeline = Connect(options, kind, device);
    groups.data_parallel = std::make_unique<SoloTransport>();
    return groups;
  }
  if (pipeline_size > 1) CheckTransportKind(kind, device);
  const auto store = RendezvousStore(options);
  RendezvousOptions pipeline = options;
  pipeline.rank = groups.pipeline_rank;
  pipeline.world_size = pipeline_size;
  groups.pipeline = pipeline_size == 1 ? std::make_unique<SoloTransport>()
                                       : TransportOver(c10::make_intrusive<c10d::PrefixStore>(
                                                           fmt::format("pipeline{}", groups.replica), store),
                                                       pipeline, kind, device);
  RendezvousOptions data_parallel = options;
  data_parallel.rank = groups.replica;
  data_parallel.world_size = replicas;
  groups.data_parallel =
      TransportOver(c10::make_intrusive<c10d::PrefixStore>(fmt::format("replicas{}", groups.pipeline_rank), store),
                    data_parallel, device.is_cuda() ? "staged" : "gloo", device);
  return groups;
}

std::unique_ptr<Transport> ConnectGloo(const RendezvousOptions& options) {
  return Connect(options, "gloo", torch::kCPU);
}

}  // namespace pipecheck::pipeline
