// A pipeline schedule as data: for each rank, the ordered list of actions it performs in one
// training step. An action is a small value (stage, kind, microbatch) that prints as `2F0` and
// parses back. Generators and the communication-lowering pass are pure functions; the
// simulator (simulator.h) decides whether a schedule is valid; the executor only interprets.
// Not an executor and not a validator: nothing here checks dependencies.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace pipecheck::pipeline {

// F: forward. B: full backward. I / W: backward split into input-gradient and weight-gradient.
// SEND_F / RECV_F: a stage's output activation to the next stage / a stage's input from the
// previous one. SEND_B / RECV_B: a stage's input gradient to the previous stage / a stage's
// output gradient from the next one.
enum class ActionKind { kForward, kBackward, kBackwardInput, kBackwardWeight, kSendForward, kRecvForward,
                        kSendBackward, kRecvBackward };

struct Action {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;
  int microbatch = 0;

  std::string ToString() const;  // "2F0", "1SEND_B3"
  bool IsCompute() const;
  bool IsSend() const;
  bool IsRecv() const;
  bool operator==(const Action& other) const;
  bool operator<(const Action& other) const;
};

// Thrown for unparseable actions and unknown schedules.
class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

Action ParseAction(const std::string& text);

// How many ranks, stages per rank and microbatches a schedule is for. Stage s runs on rank
// s % ranks (stages loop over the ranks, as interleaved schedules place them).
struct PipelineShape {
  int ranks = 1;
  int virtual_stages = 1;
  int microbatches = 1;

  int stages() const { return ranks * virtual_stages; }
  int RankOfStage(int stage) const { return stage % ranks; }
};

struct Schedule {
  std::string name;
  PipelineShape shape;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order
};

// Names the generators below answer to.
const std::vector<std::string>& ScheduleNames();

// Compute-only schedules (F and B actions), for any ranks >= 1 and microbatches >= 1.
Schedule GPipeSchedule(const PipelineShape& shape);     // all forwards, then all backwards
Schedule OneFOneBSchedule(const PipelineShape& shape);  // warm-up, one-forward-one-backward, cool-down

// The generator called `name`; throws ScheduleError for unknown names or shapes it cannot
// serve (virtual stages for a one-stage-per-rank schedule).
Schedule MakeSchedule(const std::string& name, const PipelineShape& shape);

// Adds the communication: a RECV before each compute whose input comes from another rank, a
// SEND after each compute whose output goes to another rank; then every receive is moved ahead
// of the sends just before it, so a rank always posts its receives before it sends
// (unless `post_receives_first` is false: the send_before_recv fault).
Schedule AddCommunication(const Schedule& schedule, bool post_receives_first = true);

// One line per rank: "rank 0: 0F0 0SEND_F0 0F1 ...".
std::string FormatActions(const Schedule& schedule);

}  // namespace pipecheck::pipeline
