// The message rule (see message.h).
#include "pipeline/message.h"

#include <fmt/format.h>

#include <stdexcept>

namespace pipecheck::pipeline {

const char* DirectionName(Direction direction) {
  switch (direction) {
    case Direction::kActivation: return "activation";
    case Direction::kGradient: return "gradient";
    case Direction::kTiedGradient: return "tied_gradient";
    case Direction::kResult: return "result";
  }
  return "?";
}

int MessageTag(Direction direction, int stage, int microbatch) {
  if (stage < 0 || stage >= 1024 || microbatch < 0 || microbatch >= 65536) {
    throw std::out_of_range(fmt::format("no tag for stage {} microbatch {}", stage, microbatch));
  }
  return (static_cast<int>(direction) * 1024 + stage) * 65536 + microbatch;
}

TagParts DecodeTag(int tag) {
  return {static_cast<Direction>(tag / (1024 * 65536)), tag / 65536 % 1024, tag % 65536};
}

std::string DescribeTag(int tag) {
  const auto [direction, stage, microbatch] = DecodeTag(tag);
  switch (direction) {
    case Direction::kActivation:
      return fmt::format("the activation for stage {}, microbatch {}", stage, microbatch);
    case Direction::kGradient:
      return fmt::format("the output gradient for stage {}, microbatch {}", stage, microbatch);
    case Direction::kTiedGradient:
      return fmt::format("the tied weight's gradient of stage {}", stage);
    case Direction::kResult:
      return fmt::format("the results of rank {}", stage);
  }
  return fmt::format("message tag {}", tag);
}

Action Message::Send() const {
  return {direction == Direction::kActivation ? ActionKind::kSendForward : ActionKind::kSendBackward, FromStage(),
          microbatch};
}

Action Message::Receive() const {
  return {direction == Direction::kActivation ? ActionKind::kRecvForward : ActionKind::kRecvBackward, stage,
          microbatch};
}

std::string Message::ToString() const {
  return fmt::format("{} for stage {}, microbatch {}", direction == Direction::kActivation ? "activation" : "output gradient",
                     stage, microbatch);
}

Message MessageOf(const Action& communication) {
  switch (communication.kind) {
    case ActionKind::kSendForward: return {Direction::kActivation, communication.stage + 1, communication.microbatch};
    case ActionKind::kRecvForward: return {Direction::kActivation, communication.stage, communication.microbatch};
    case ActionKind::kSendBackward: return {Direction::kGradient, communication.stage - 1, communication.microbatch};
    case ActionKind::kRecvBackward: return {Direction::kGradient, communication.stage, communication.microbatch};
    default: throw ScheduleError(fmt::format("{} is no communication action", communication.ToString()));
  }
}

int SenderRank(const PipelineShape& shape, const Message& message) { return shape.RankOfStage(message.FromStage()); }

int ReceiverRank(const PipelineShape& shape, const Message& message) { return shape.RankOfStage(message.stage); }

int PeerOf(const PipelineShape& shape, const Action& action) {
  if (action.IsCompute()) return -1;
  const Message message = MessageOf(action);
  return action.IsSend() ? ReceiverRank(shape, message) : SenderRank(shape, message);
}

namespace {

// The message between compute action `compute` and its neighbour in `direction`, when the two
// stages sit on different ranks; `incoming` picks what it takes rather than what it produces.
std::optional<Message> Crossing(const PipelineShape& shape, const Action& compute, bool incoming) {
  const int s = compute.stage, mb = compute.microbatch;
  const bool forward = compute.kind == ActionKind::kForward;
  const bool backward = compute.kind == ActionKind::kBackward || compute.kind == ActionKind::kBackwardInput;
  if (!forward && !backward) return std::nullopt;
  // Forward takes from s - 1 and gives to s + 1; backward the other way round.
  const int neighbour = forward == incoming ? s - 1 : s + 1;
  if (neighbour < 0 || neighbour >= shape.stages() || shape.RankOfStage(neighbour) == shape.RankOfStage(s)) {
    return std::nullopt;
  }
  const Direction direction = forward ? Direction::kActivation : Direction::kGradient;
  return Message{direction, incoming ? s : neighbour, mb};
}

}  // namespace

std::optional<Message> InputMessage(const PipelineShape& shape, const Action& compute) {
  return Crossing(shape, compute, /*incoming=*/true);
}

std::optional<Message> OutputMessage(const PipelineShape& shape, const Action& compute) {
  return Crossing(shape, compute, /*incoming=*/false);
}

int InputPeer(const PipelineShape& shape, const Action& compute) {
  const auto input = InputMessage(shape, compute);
  return input ? SenderRank(shape, *input) : -1;
}

std::vector<Action> ReceivesInSendOrder(const Schedule& schedule, int from, int to) {
  std::vector<Action> order;
  for (const Action& action : schedule.ranks[from]) {
    if (!action.IsSend()) continue;
    const Message message = MessageOf(action);
    if (ReceiverRank(schedule.shape, message) == to) order.push_back(message.Receive());
  }
  return order;
}

std::vector<Action> ReceivesPosted(const Schedule& schedule, int from, int to) {
  std::vector<Action> posted;
  for (const Action& action : schedule.ranks[to]) {
    if (action.IsRecv() && SenderRank(schedule.shape, MessageOf(action)) == from) posted.push_back(action);
  }
  return posted;
}

}  // namespace pipecheck::pipeline
