// Who sends what to whom: the one rule every part of the pipeline derives its messages from.
// A pipeline message is a stage's activation going to the next stage, or a stage's input
// gradient going back to the previous one, for one microbatch. The lowering pass, the simulator,
// the executor, the memory model and the communication plan all ask this file which message an
// action sends, receives or waits for, who its peer is and what its tag is; none of them derives
// it again.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "pipeline/schedule.h"

namespace pipecheck::pipeline {

// What a message carries. Pipeline messages are activations and gradients; the tied weight's
// gradient and the ranks' results travel over the same transports, with tags of their own.
enum class Direction { kActivation = 0, kGradient = 1, kTiedGradient = 2, kResult = 3 };

// The direction as reports spell it: activation, gradient, tied_gradient, result.
const char* DirectionName(Direction direction);

// A tag unique per (direction, stage, microbatch); stages < 1024, microbatches < 65536 (throws
// std::out_of_range beyond).
int MessageTag(Direction direction, int stage, int microbatch);

// What a tag names, read back.
struct TagParts {
  Direction direction;
  int stage;
  int microbatch;
};
TagParts DecodeTag(int tag);

// What a tag says: "the activation for stage 2, microbatch 5".
std::string DescribeTag(int tag);

// One pipeline message, named by where it goes: the activation `stage` takes as its input
// (sent by stage - 1), or the output gradient `stage` takes to start its backward (sent by
// stage + 1), for `microbatch`.
struct Message {
  Direction direction = Direction::kActivation;  // kActivation or kGradient
  int stage = 0;                                 // the stage that receives it
  int microbatch = 0;

  int FromStage() const { return direction == Direction::kActivation ? stage - 1 : stage + 1; }
  int Tag() const { return MessageTag(direction, stage, microbatch); }
  Action Send() const;     // the sending stage's action: (stage-1)SEND_F or (stage+1)SEND_B
  Action Receive() const;  // the receiving stage's action: RECV_F or RECV_B
  std::string ToString() const;  // "activation for stage 2, microbatch 5"

  bool operator==(const Message& other) const { return Key() == other.Key(); }
  bool operator<(const Message& other) const { return Key() < other.Key(); }

 private:
  std::tuple<Direction, int, int> Key() const { return {direction, stage, microbatch}; }
};

// The message a send produces or a receive consumes (throws ScheduleError for a compute action).
Message MessageOf(const Action& communication);

// The ranks at either end of a message.
int SenderRank(const PipelineShape& shape, const Message& message);
int ReceiverRank(const PipelineShape& shape, const Message& message);

// The rank a communication action talks to; -1 for a compute action.
int PeerOf(const PipelineShape& shape, const Action& action);

// The message a compute action takes from another rank: a forward's input activation, a B's or
// I's output gradient, where the neighbouring stage sits on another rank. None when its input is
// local (same rank) or there is none (stage 0's forward, the last stage's backward, any W).
std::optional<Message> InputMessage(const PipelineShape& shape, const Action& compute);

// The message a compute action's result leaves as, where it goes to another rank: a forward's
// output to the next stage, a B's or I's input gradient to the previous one.
std::optional<Message> OutputMessage(const PipelineShape& shape, const Action& compute);

// The rank a compute action's input comes from, or -1 (local, or none).
int InputPeer(const PipelineShape& shape, const Action& compute);

// The receives rank `to` must post for rank `from`'s messages, in the order `from` sends them
// (messages between two ranks are matched by order: the transport discipline, transport.h).
std::vector<Action> ReceivesInSendOrder(const Schedule& schedule, int from, int to);

// Rank `to`'s receives from rank `from`, in the order `to` posts them.
std::vector<Action> ReceivesPosted(const Schedule& schedule, int from, int to);

}  // namespace pipecheck::pipeline
