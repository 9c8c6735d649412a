// Runs every rank's action list together, in lockstep, to decide whether a schedule is valid
// before anything executes it: it rejects actions on the wrong rank, repeated or missing
// work, sends without receives, broken dependencies and deadlocks (also those that appear only
// when a send blocks until its receive is posted). On failure it prints a step-by-rank grid
// that marks where each rank stopped. It also predicts the bubble and peak in-flight
// microbatches under a cost model. Not a performance model of any real machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace pipecheck::pipeline {

// Durations of compute actions; communication is free. Or, with `per_action`, the duration of
// every action of every rank ([rank][index in its list], measured ones for instance).
struct CostModel {
  double forward = 1.0;
  double backward = 1.0;         // B
  double backward_input = 0.5;   // I
  double backward_weight = 0.5;  // W
  std::vector<std::vector<double>> per_action;
};

enum class SendSemantics {
  kBuffered,    // a send completes at once (the message waits at the receiver)
  kRendezvous,  // a send completes only once the receiver has posted the matching receive
  // NCCL on GPUs (the nccl transport): the host never blocks. Each rank has a compute stream
  // (its compute actions, in order), and each ordered pair of ranks that exchanges messages has a
  // channel of its own (a two-rank NCCL communicator on which one rank only sends and the other
  // only receives, with a stream on each side). A message's send or receive starts on its side's
  // channel stream once the compute stream has done everything issued before it (c10d makes the
  // communication stream wait for the current one) and the channel's previous message on that
  // side is done; both ends are done once both have started (NCCL's point-to-point transfer needs
  // both kernels running). A compute action that takes a received message waits for that
  // receive; a send makes the compute stream wait for the previous send to the same peer and
  // direction (the executor's IssueSend). One shared stream per rank, which is where c10d's
  // coalesced groups go, would instead queue a receive posted early ahead of sends its peer needs
  // first, and deadlock 1F1B from two ranks on.
  kDeviceStreams,
};

struct SimulationResult {
  bool ok = false;
  std::string error;  // why not, with the grid, when !ok
  std::string grid;   // step-by-rank grid of the lockstep run
  double makespan = 0.0;
  std::vector<double> finish;          // per rank: when its last action ends
  double bubble = 0.0;                 // 1 - busy / (ranks * makespan)
  std::vector<double> busy;            // per rank
  std::vector<int> peak_in_flight;     // per rank: most microbatches forwarded, not yet backwarded
  std::vector<std::vector<double>> start_times;  // [rank][action index]
  std::vector<size_t> stuck_at;        // when deadlocked: each rank's next action index
};

// Simulates a lowered schedule (with communication).
SimulationResult Simulate(const Schedule& schedule, SendSemantics semantics, const CostModel& costs = {});

// How many times this process has called Simulate (a lowering's deadlock search, a validation, a
// replay of measured action times): with ValidationsRun and SchedulesBuilt (trainer.h), how a
// worker shows it built no schedule its plan already held.
int64_t SimulationsRun();

// Empty when every rank posts its receives from each peer in the order that peer sends them;
// otherwise the first pair and message where they differ.
std::string MessageOrderProblem(const Schedule& schedule);

// Where a transport's messages wait: on the host (gloo, staged) or on device streams (nccl:
// kDeviceStreams). Both run the same lowering: a receive posted early lets its message land
// during the compute before it, on the host or on its channel's stream.
enum class CommunicationModel { kHost, kDeviceStreams };

// Simulates under both host send semantics and checks the message order (MessageOrderProblem),
// and for device streams also simulates kDeviceStreams; throws ScheduleError with the first
// failure's report. Returns the buffered run's result.
SimulationResult ValidateSchedule(const Schedule& schedule, const CostModel& costs = {},
                                  CommunicationModel model = CommunicationModel::kHost);

// How many times this process has called ValidateSchedule.
int64_t ValidationsRun();

// A generated schedule's makespan as published for its algorithm, under `costs` (per stage, so
// per chunk for several stages per rank) with free communication, or none where no closed form
// is published (zbv, imported CSVs):
//   gpipe, 1f1b:  (m + p - 1)(F + B)                      (GPipe; Narayanan et al., PipeDream-Flush)
//   interleaved:  (v m + p - 1)(F + B)                    (Megatron-LM's interleaved 1F1B, v chunks)
//   zbh1:         m(F + I + W) + (p - 1)(F + I - W)       (Qi et al., ZB-H1)
//   dualpipev:    2m(F + B) + (p/2 - 1)(F&B + B - 3W)     (DeepSeek's DualPipe bubble; B = I + W, and
//                 F&B = F + B: pipecheck runs a forward-backward pair one after the other, with no
//                 overlap inside the rank, where the published figure assumes one; the simulated
//                 makespan is that much longer)
// `formula` receives the formula as text with its values substituted.
std::optional<double> PublishedMakespan(const std::string& schedule_name, const PipelineShape& shape,
                                        const CostModel& costs, std::string* formula = nullptr);

// A time chart of the schedule: one row per rank, one column per time unit of `costs`.
std::string FormatTimeline(const Schedule& schedule, const SimulationResult& result, const CostModel& costs);

}  // namespace pipecheck::pipeline
