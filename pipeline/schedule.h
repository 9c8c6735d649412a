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

// "F", "B", "I", "W", "SEND_F", ...: how actions and timeline.csv name a kind.
const char* KindText(ActionKind kind);

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
// How stages sit on ranks. Round robin: stage s on rank s % p (GPipe, 1F1B, interleaved). V: two
// stages per rank, down then back up (stage s on rank s for s < p, on rank 2p-1-s after), as
// ZB-V and DualPipeV place them: the first and last stages share rank 0, and the two stages at
// the V's bottom share rank p-1, handing tensors over without the transport.
enum class Placement { kRoundRobin, kV };

struct PipelineShape {
  int ranks = 1;
  int virtual_stages = 1;
  int microbatches = 1;
  Placement placement = Placement::kRoundRobin;

  int stages() const { return ranks * virtual_stages; }
  int RankOfStage(int stage) const {
    return placement == Placement::kV && stage >= ranks ? 2 * ranks - 1 - stage : stage % ranks;
  }
  std::string PlacementRule() const;  // "stage s on rank s % 4", for messages
};

struct Schedule {
  std::string name;
  PipelineShape shape;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order
};

// A schedule of `shape` with no actions yet, named `name`; throws ScheduleError for a shape with
// fewer than one rank, microbatch or virtual stage, or several virtual stages where
// `virtual_stages_allowed` is false.
Schedule EmptySchedule(const std::string& name, const PipelineShape& shape, bool virtual_stages_allowed = false);

// One entry per generator: the only list of schedule names. Names, help text, the scenario
// loader's rules on virtual stages, the invariance variants and MakeSchedule all read it, so a
// new schedule is its generator plus one entry here (schedule.cc's ScheduleRegistry).
struct ScheduleInfo {
  std::string name;
  Schedule (*generate)(const PipelineShape&);
  std::string summary;             // one line, for help text
  int default_virtual_stages = 1;  // when a scenario leaves virtual_stages out
  bool several_stages_per_rank = false;  // takes virtual_stages > 1
  int fixed_virtual_stages = 0;    // the one count it runs (2 for a V), or 0 for any
  Placement placement = Placement::kRoundRobin;
};
const std::vector<ScheduleInfo>& ScheduleRegistry();
// The entry called `name`, or null.
const ScheduleInfo* FindSchedule(const std::string& name);

// Names the generators answer to, in registry order.
const std::vector<std::string>& ScheduleNames();

// Compute-only schedules (F and B actions), for any ranks >= 1 and microbatches >= 1.
Schedule GPipeSchedule(const PipelineShape& shape);     // all forwards, then all backwards
Schedule OneFOneBSchedule(const PipelineShape& shape);  // warm-up, one-forward-one-backward, cool-down
// Interleaved 1F1B (Megatron's, PyTorch's Interleaved1F1B): v >= 2 stages per rank, stage s on
// rank s % p, microbatches a multiple of p.
Schedule InterleavedSchedule(const PipelineShape& shape);
// Zero bubble ZB-H1 (Qi et al.): 1F1B with each backward split into input gradient (I) and
// weight gradient (W), rank r's W's deferred by r microbatches into the waits for gradients.
// Peak in-flight microbatches p on every rank (1F1B's peak, rank 0's); with F = I = W the
// makespan is m(F + I + W) + (p - 1)(F + I - W).
Schedule ZeroBubbleH1Schedule(const PipelineShape& shape);
// Zero bubble V (ZB-V, Qi et al.): two stages per rank in a V (virtual_stages 2, or 1 taken as
// 2), backward split into I and W. Built by list scheduling with unit costs: a free rank runs a
// ready I first (oldest microbatch, the V's upper stage first), else a ready F while it holds
// fewer than 2p stage-microbatches (1F1B's peak activation memory: each V stage has half a
// 1F1B stage's layers), else a pending W. Its bubble is a fraction of 1F1B's.
Schedule ZeroBubbleVSchedule(const PipelineShape& shape);
// DualPipeV (DeepSeek's DualPipe cut in half, as PyTorch's ScheduleDualPipeV builds it): two
// stages per rank in a V, microbatches >= 2p. The down stage fills the V, then both stages
// forward; the steady state pairs one stage's forward with the other's whole backward, both
// ways; the cool-down splits the last backwards into I and W to fill the drain.
Schedule DualPipeVSchedule(const PipelineShape& shape);
// Looped BFS (Lamy-Poirier's breadth-first pipeline; PyTorch's ScheduleLoopedBFS): v >= 1 stages
// per rank, stage s on rank s % p. Each rank runs its stages' forwards stage after stage, every
// microbatch through one before the next, then their backwards in the reverse order, stage by
// stage, newest microbatch first: GPipe's memory (every microbatch held on every stage), with a
// stage's input gradients of all microbatches waiting on a rank at once.
Schedule LoopedBfsSchedule(const PipelineShape& shape);
// Why `shape` cannot run interleaved, or "" when it can.
std::string InterleavedConstraint(const PipelineShape& shape);

// The generator called `name`; throws ScheduleError for unknown names or shapes it cannot
// serve (virtual stages for a one-stage-per-rank schedule).
Schedule MakeSchedule(const std::string& name, const PipelineShape& shape);

// Gradient accumulation: `schedule` run `rounds` times in a row on every rank, round k over
// microbatches k x m .. (k + 1) x m - 1 (m its own count), as one schedule of rounds x m
// microbatches. Each rank starts a round when it has done its part of the one before; nothing
// of one round waits for another's. A compute-only schedule in, a compute-only schedule out.
Schedule RepeatRounds(const Schedule& schedule, int rounds);

// The drain's input gradient sent before the weight gradients: on every stage whose input comes
// from another rank, its last backward, where that is a whole B with a forward just before it on
// its rank (1F1B's last stage: F then B), becomes I then W. The rank before it, one backward
// behind and with only its own last backward left, waits for that forward and the whole B; with
// the split it starts once I is done, while this rank makes its weight gradients. Where backwards
// run back to back (GPipe, 1F1B's middle stages) the receiver is still busy when the gradient
// comes, and a split would only hold the weights' output gradients from I to W. Schedules already
// split (zero bubble) and stages whose input is a local handoff are left as they are.
// A compute-only schedule in, a compute-only schedule out; one round (RepeatRounds after it).
Schedule SplitDrainBackwards(const Schedule& schedule);

// One line per rank: "rank 0: 0F0 0SEND_F0 0F1 ...".
std::string FormatActions(const Schedule& schedule);

}  // namespace pipecheck::pipeline
