// The communication record and its plan (see comm_record.h).
#include "pipeline/comm_record.h"

#include <fmt/format.h>

#include "pipeline/message.h"
#include "reference/gradient_accumulation.h"

namespace pipecheck::pipeline {
namespace {

int64_t PayloadBytes(const torch::Tensor& tensor) { return tensor.numel() * static_cast<int64_t>(tensor.element_size()); }

// A receive's record, completed when the message has arrived.
class RecordedRecv : public PendingRecv {
 public:
  RecordedRecv(std::unique_ptr<PendingRecv> inner, std::shared_ptr<std::vector<MessageRecord>> messages, size_t index)
      : inner_(std::move(inner)), messages_(std::move(messages)), index_(index) {}
  torch::Tensor Wait() override {
    auto tensor = inner_->Wait();
    if (index_ < messages_->size()) {  // recorded in a step that has not been handed over yet
      auto& record = (*messages_)[index_];
      record.shape = {tensor.scalar_type(), tensor.sizes().vec()};
      record.bytes = PayloadBytes(tensor);
    }
    return tensor;
  }

 private:
  std::unique_ptr<PendingRecv> inner_;
  std::shared_ptr<std::vector<MessageRecord>> messages_;
  size_t index_;
};

MessageShape BoundaryShape(const PipelineConfig& config, const reference::Batch& microbatch) {
  return {config.train.dtype, {microbatch.size(), microbatch.time(), config.train.model.hidden}};  // (b, t, hidden)
}

}  // namespace

std::string Describe(const MessageRecord& message) {
  return fmt::format("{} {} {} rank {}: {}", message.send ? "send" : "receive", DescribeTag(message.tag),
                     message.send ? "to" : "from", message.peer,
                     message.bytes < 0 && !message.send ? "never arrived" : message.shape.ToString());
}

void RecordingTransport::Start(int64_t step) {
  recording_ = true;
  step_ = step;
  messages_ = std::make_shared<std::vector<MessageRecord>>();
}

std::vector<MessageRecord> RecordingTransport::Stop() {
  recording_ = false;
  std::vector<MessageRecord> messages = std::move(*messages_);
  messages_ = std::make_shared<std::vector<MessageRecord>>();  // receives still pending write elsewhere
  return messages;
}

std::unique_ptr<PendingSend> RecordingTransport::Send(const torch::Tensor& tensor, int peer, int tag,
                                                      const std::optional<MessageShape>& announced) {
  if (recording_) {
    messages_->push_back({step_, true, peer, tag,
                          announced ? *announced : MessageShape{tensor.scalar_type(), tensor.sizes().vec()},
                          PayloadBytes(tensor)});
  }
  return inner_.Send(tensor, peer, tag, announced);
}

std::unique_ptr<PendingRecv> RecordingTransport::Recv(int peer, int tag, torch::Device device,
                                                      const std::optional<MessageShape>& expected) {
  auto inner = inner_.Recv(peer, tag, device, expected);
  if (!recording_) return inner;
  messages_->push_back({step_, false, peer, tag, MessageShape{}, -1});
  return std::make_unique<RecordedRecv>(std::move(inner), messages_, messages_->size() - 1);
}

std::vector<MessageRecord> PlannedMessages(const PipelineConfig& config, const Schedule& schedule, int rank,
                                           int64_t step, const reference::Batch& batch) {
  const auto microbatches = ReplicaMicrobatches(config, batch);
  const auto& shape = schedule.shape;
  std::vector<MessageRecord> plan;
  for (const Action& action : schedule.ranks.at(rank)) {
    if (action.IsCompute()) continue;
    const Message message = MessageOf(action);
    const MessageShape boundary = BoundaryShape(config, microbatches.at(message.microbatch));
    const int64_t bytes = c10::multiply_integers(boundary.sizes) * static_cast<int64_t>(c10::elementSize(boundary.dtype));
    plan.push_back({step, action.IsSend(), PeerOf(shape, action), message.Tag(), boundary, bytes});
  }
  const int last = shape.stages() - 1;
  const int first_rank = shape.RankOfStage(0), last_rank = shape.RankOfStage(last);
  if (config.train.model.tied && first_rank != last_rank && (rank == first_rank || rank == last_rank)) {
    const bool is_first = rank == first_rank;
    const auto& model = config.train.model;
    const MessageShape gradient{reference::AccumulatesInFloat32(config.train.dtype) ? torch::kFloat32 : config.train.dtype,
                                {model.vocab, model.hidden}};  // (vocab, hidden)
    const int64_t bytes = model.vocab * model.hidden * static_cast<int64_t>(c10::elementSize(gradient.dtype));
    const int peer = is_first ? last_rank : first_rank;
    plan.push_back({step, false, peer, MessageTag(Direction::kTiedGradient, is_first ? last : 0, 0), gradient, bytes});
    plan.push_back({step, true, peer, MessageTag(Direction::kTiedGradient, is_first ? 0 : last, 0), gradient, bytes});
  }
  return plan;
}

}  // namespace pipecheck::pipeline
