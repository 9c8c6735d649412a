// One rank of the pipeline-parallel trainer: builds this rank's stages (same global names and
// initial values as the reference), then each step has the executor run this rank's
// simulator-accepted action list, sums the tied weight's gradients between its two owners,
// clips by the global norm over all ranks and applies the optimizer, measured in the same
// window as the reference's step.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/comm_record.h"
#include "pipeline/executor.h"
#include "pipeline/faults.h"
#include "pipeline/flight_recorder.h"
#include "pipeline/gradient_path.h"
#include "pipeline/gradient_sync.h"
#include "pipeline/rank_result.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "pipeline/stage.h"
#include "pipeline/transport.h"
#include "reference/trainer.h"

namespace pipecheck::pipeline {

// Timed steps a run of pipecheck's own trainer takes for a within-run spread of tokens/s (the
// judged ones after the warm-up, then timing-only ones: PipelineConfig::timed_samples), and the
// most time the timing-only steps may take, at the judged steps' pace.
constexpr int kTimedSamples = 20;
constexpr double kTimingBudgetMs = 3000.0;

// One round of the schedule pipecheck's trainer runs for `schedule` (a generator's name or
// csv:FILE): a generator's lists with the drain's last backwards split (SplitDrainBackwards), so
// each stage's last input gradient leaves before its weight gradients are made; a CSV file's
// lists as written.
Schedule TrainerRound(const std::string& schedule, const PipelineShape& round);

// The validated, lowered schedule every rank of this configuration runs: its accumulation
// rounds of the named schedule, one after another.
Schedule BuildSchedule(const PipelineConfig& config);

// The same schedule lowered but not validated, or none where lowering would simulate more than
// `budget` actions (LowerScheduleWithin; negative: no limit): for sizing a configuration (the
// memory model) whose schedule has been validated already, or will be by the ranks that run it.
std::optional<Schedule> LoweredScheduleWithin(const PipelineConfig& config, int64_t budget);

// How many schedules this process has built for a configuration (LoweredScheduleWithin, which
// BuildSchedule calls): none in a worker handed a plan.
int64_t SchedulesBuilt();

// Every ordered pair of ranks (from, to) that carries a message in a step of `schedule` (its
// sends, and the tied sum's exchange), sorted, each once: the same list on every rank, handed to
// Transport::OpenChannels before the first step.
std::vector<std::pair<int, int>> MessageChannels(const PipelineConfig& config, const Schedule& schedule);

class PipelineTrainer {
 public:
  // `replicas`: the data-parallel group of this pipeline rank (ConnectGroups), borrowed; null
  // with one replica.
  PipelineTrainer(const PipelineConfig& config, Transport& transport, Transport* replicas = nullptr);
  // With the schedule already built for this configuration (BuildSchedule, as a plan holds it):
  // nothing is lowered or simulated again.
  PipelineTrainer(const PipelineConfig& config, Schedule schedule, Transport& transport, Transport* replicas = nullptr);
  ~PipelineTrainer();

  // One training step on MakeBatch(seed, step); returns this rank's record of it. A step that is
  // not `judged` (a timing-only step) keeps no copies of the weights or gradients.
  void Step(int64_t step, RankResult& result, bool judged = true);

  // Every step, then the final weights; `after_step(step, result)` runs after each step (progress).
  // Then, where config.timed_samples asks for more timed steps than the judged ones give, the
  // timing-only steps (RunTimingSteps).
  RankResult Train(const std::function<void(int64_t, const RankResult&)>& after_step = {});

  const Schedule& schedule() const { return schedule_; }

  // Global rank 0, once every rank has written its share of config.save_checkpoint (its results
  // arrived after it had): the manifest that makes the checkpoint complete (checkpoint.h).
  void CommitCheckpoint() const;

  // Marks a phase outside the schedule's actions (gathering results) in the flight record.
  void RecordPhase(int64_t step, const std::string& what, int peer);
  void EndPhase();

 private:
  std::vector<torch::Tensor> OwnedParameters() const;  // with the tied copy
  reference::NamedTensors WeightCopies() const;        // detached copies of this rank's parameters
  reference::NamedTensors GradientCopies() const;
  reference::NamedTensors BiasCopies() const;
  reference::NamedTensors RoutingCopies() const;  // the last step's choices, under RoutingName  // copies of this rank's expert biases (expert_bias > 0)
  // Auxiliary-loss-free balancing: each of this rank's MoE layers' bias moved by its layer's
  // `counts` (this replica's), summed over the replicas first. Nothing without expert_bias.
  // Returns the counts that moved them, under ExpertCountsName.
  reference::NamedTensors MoveExpertBiases(const std::map<int64_t, torch::Tensor>& counts);
  // One stage of the gradient path, in step `step` that began at `started`.
  void RunGradientStage(const GradientStage& stage, int64_t step, RankResult& result,
                        std::chrono::steady_clock::time_point started);
  // The data-parallel average of every owned gradient as `average` says, recorded with its
  // timing; once a step (a second call does nothing); nothing with one replica.
  void AverageReplicas(int64_t step, RankResult& result, const GradientStage& average);
  double StepStartMicroseconds(const RankResult& result, int64_t step) const;
  void AlignClocks();  // sets the executor's clock origin, the same instant on every rank
  // Steps on the last judged step's batch again, timed and otherwise discarded, so one run's
  // tokens/s has a spread: as many as make config.timed_samples timed steps, within
  // kTimingBudgetMs of the judged steps' pace; every rank of every replica agrees on the count.
  void RunTimingSteps(RankResult& result);
  // Resumption: this rank's share of config.save_checkpoint after the last step, and the state of
  // config.load_checkpoint set into its stages, optimizer and data position before the first;
  // what it then holds, read back (RankResult::loaded).
  void SaveCheckpoint() const;
  void LoadCheckpoint();
  reference::NamedTensors LoadedState() const;

  PipelineConfig config_;
  RecordingTransport transport_;  // every step's messages recorded, for the communication check
  Transport* replicas_ = nullptr;  // the data-parallel group; null with one replica
  bool averaged_this_step_ = false;
  ReplicaBuckets replica_buckets_;  // the data-parallel average's flat buckets, kept from step to step
  Seams seams_;  // the correct pipeline's, unless the scenario injects a bug (faults.h)
  std::unique_ptr<Transport> messages_;  // the executor's transport: transport_ behind the message seam
  Schedule schedule_;
  Stages stages_;  // this rank's stages, ascending
  bool owns_moe_layers_ = false;  // whether any of stages_ holds a mixture-of-experts layer
  int64_t baseline_bytes_ = 0;  // tensor bytes held on its device before the trainer existed
  std::unique_ptr<reference::GradientAccumulator> accumulator_;  // over OwnedParameters()
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<FlightRecorder> recorder_;  // config.flight_record's, or one that records nothing
  int replica_ = 0;  // this rank's replica; config_.replica is whose share of each batch it trains on
  int64_t data_position_ = 0;  // the batch the next judged step trains on
};

}  // namespace pipecheck::pipeline
