// What the transports share (transport.cc: gloo and staged; transport_nccl.cc: nccl): the
// message header, the discipline's checks, and the Gloo transport that also carries the nccl
// transport's CPU messages. Not for callers outside pipeline/transport*.cc.
#pragma once

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

#include "pipeline/c10d_compat.h"
#include "pipeline/transport.h"

namespace pipecheck::pipeline {

struct MessageHeader {
  int tag = 0;
  MessageShape shape;
};

// The header of a message `tag` of `shape`, an int64 CPU tensor of kMessageHeaderBytes.
torch::Tensor MakeHeader(int tag, const MessageShape& shape);
// Reads a header (any device) received from `peer`; throws on a corrupt one.
MessageHeader ReadHeader(const torch::Tensor& header, int peer);
// Throws unless `got` is message `tag` (the discipline: matched by order, so this is the order
// check) and, where the plan knows it, of the `expected` shape.
void CheckHeader(const MessageHeader& got, int peer, int rank, int tag, const std::optional<MessageShape>& expected);

// A Gloo process group over `store` for this rank, facing the rendezvous host.
compat::GlooGroup MakeGloo(const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& options);
// The gloo (or, with `staged`, staged) transport over `group`.
std::unique_ptr<Transport> MakeGlooTransport(c10::intrusive_ptr<c10d::Store> store, compat::GlooGroup group,
                                             const RendezvousOptions& options, bool staged);
// The nccl transport for this rank's CUDA `device` (transport_nccl.cc; throws in a build without it).
std::unique_ptr<Transport> MakeNcclTransport(const c10::intrusive_ptr<c10d::Store>& store,
                                             const RendezvousOptions& options, torch::Device device);

}  // namespace pipecheck::pipeline
