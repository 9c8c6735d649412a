// The communication record: every point-to-point message a rank actually posted during its
// steps (peer, what the message is, dtype, shape, bytes, order), taken by a transport that wraps
// the real one, and the plan it must match: the messages the lowered schedule and the tied-weight
// exchange make each rank post, in order. The harness compares the two (harness/comm_check.h),
// so a message sent twice, never sent, sent out of order or of the wrong shape is named even
// when the numbers come out right. Not the transport's own order check (transport.h): that one
// stops a run at the first mix-up; this one records everything and judges afterwards.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "pipeline/transport.h"
#include "reference/data.h"

namespace pipecheck::pipeline {

// One message as a rank posted it (a send, or a receive and what arrived).
struct MessageRecord {
  int64_t step = 0;
  bool send = true;
  int peer = 0;
  int tag = 0;                // MessageTag: direction, stage, microbatch
  MessageShape shape;         // a send's header; what a receive got (no sizes until it arrived)
  int64_t bytes = -1;         // payload bytes; -1 for a receive that never completed
};

// "send the activation for stage 1, microbatch 2 to rank 1: float64 (2, 16, 32)"
std::string Describe(const MessageRecord& message);

// Forwards everything to `inner`, recording each Send and Recv made between Start and Stop.
// Collectives (AllGather, Barrier) pass through unrecorded.
class RecordingTransport : public Transport {
 public:
  explicit RecordingTransport(Transport& inner) : inner_(inner) {}

  void Start(int64_t step);
  // Ends the step's recording and hands its messages over.
  std::vector<MessageRecord> Stop();

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string name() const override { return inner_.name(); }
  void OpenChannels(const std::vector<std::pair<int, int>>& channels) override { inner_.OpenChannels(channels); }
  torch::Tensor SendBuffer(const torch::Tensor& like) override { return inner_.SendBuffer(like); }
  std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                    const std::optional<MessageShape>& announced) override;
  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override;
  std::vector<double> AllGather(double value) override { return inner_.AllGather(value); }
  void Barrier() override { inner_.Barrier(); }
  void CheckReceived() override { inner_.CheckReceived(); }

 private:
  Transport& inner_;
  bool recording_ = false;
  int64_t step_ = 0;
  std::shared_ptr<std::vector<MessageRecord>> messages_ = std::make_shared<std::vector<MessageRecord>>();
};

// The messages rank `rank` must post in one step on `batch`, in order: the communication actions
// of its lowered list, then the tied weight's gradient exchange between the first and last
// stages' ranks (receive, then send), when those are two ranks.
std::vector<MessageRecord> PlannedMessages(const PipelineConfig& config, const Schedule& schedule, int rank,
                                           int64_t step, const reference::Batch& batch);

}  // namespace pipecheck::pipeline
