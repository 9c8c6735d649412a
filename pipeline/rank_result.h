// What one rank of the pipeline reports about a run (losses, gradients and weights per step,
// timings, peak memory, its executed actions), and how it travels to rank 0: packed as a
// pickled dict over the transport. Not a judge: harness/parity.h compares it.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "pipeline/action_timing.h"
#include "pipeline/comm_record.h"
#include "pipeline/schedule.h"
#include "pipeline/transport.h"
#include "reference/fingerprint.h"
#include "reference/trainer.h"

namespace pipecheck::pipeline {

// Where a rank fingerprinted a tensor crossing a stage boundary.
enum class BoundaryRole { kSent = 0, kReceived = 1, kHandedOver = 2 };  // handed over: both stages on this rank

// One boundary tensor as a rank saw it: the activation going into `stage`, or the gradient
// coming back into `stage` (its output's gradient, from stage + 1).
struct BoundaryRecord {
  int64_t step = 0;
  int microbatch = 0;
  int stage = 0;
  Direction direction = Direction::kActivation;
  BoundaryRole role = BoundaryRole::kReceived;
  int peer = -1;  // the rank it went to or came from; -1 when handed over
  reference::Fingerprint fingerprint;
};

// One data-parallel collective as a rank performed it (the gradient average across replicas).
struct CollectiveRecord {
  int64_t step = 0;
  int64_t elements = 0;  // summed per replica
  int64_t bytes = 0;
  int replicas = 1;
  double start_us = 0.0;  // since the step started, on the run's clock (ActionTiming's)
  double end_us = 0.0;
  double step_start_us = 0.0;
};

// What one rank produced over the whole run.
struct RankResult {
  int rank = 0;     // in its pipeline
  int replica = 0;  // which replica of the pipeline (data parallelism); 0 with one
  int replicas = 1;
  std::vector<int> stages;
  std::vector<double> losses;      // per step; only the last stage's rank knows them (NaN elsewhere)
  // Per step, the balance loss (mixture of experts) summed over every stage and replica: the part
  // of `losses` that is not cross entropy. The last stage's rank, NaN elsewhere and without MoE.
  std::vector<double> aux_losses;
  std::vector<double> step_ms;     // per step, this rank's wall time
  // Timing-only steps after the judged ones (the last judged step's batch again, nothing
  // recorded or judged): their wall times, for a spread of tokens/s within one run.
  std::vector<double> timing_step_ms;
  std::vector<double> grad_norms;  // per step, global norm before clipping
  std::vector<int64_t> peak_bytes; // per step, tensor bytes this rank held at most; -1 unmetered
  std::vector<reference::NamedTensors> gradients;  // per step, as applied (after tied sum and clipping)
  std::vector<reference::NamedTensors> weights;    // per step, the weights the step started from
  // Per step, the float32 weights the optimizer stepped, after the step: only from a trainer that
  // keeps them beside lower-precision parameters (its bf16 optimizer's master weights); empty else.
  std::vector<reference::NamedTensors> master_weights;
  reference::NamedTensors final_weights;
  // expert_bias > 0: per step, the expert biases the step started with (keys as `weights`'), and
  // after the last step.
  std::vector<reference::NamedTensors> expert_biases;
  reference::NamedTensors final_expert_biases;
  // expert_bias > 0: per step, the routing counts (E, int64) that moved each of the rank's MoE
  // layers' bias, under ExpertCountsName: the whole batch's, summed over the replicas.
  std::vector<reference::NamedTensors> expert_counts;
  // Mixture of experts, pipecheck's trainer: per step, each MoE layer's choices for each of the
  // replica's microbatches ((its sequences · its padded length, k) int64), under RoutingName. The
  // judge's reference gives way to them where its own choice is decided within rounding.
  std::vector<reference::NamedTensors> routing;
  // A run resumed from a checkpoint (scenario column `resume`) trains from step first_step on: its
  // per-step vectors hold placeholders before it (NaN, -1, empty), so every index (and every
  // record's step) is a step of the whole run.
  int64_t first_step = 0;
  // Such a run's state right after loading its checkpoint, read off this rank's live parameters,
  // optimizer and data position: under checkpoint keys (checkpoint.h: weight/NAME, exp_avg/NAME,
  // exp_avg_sq/NAME, step/NAME, expert_bias/NAME; a second copy on one rank under StageCopyKey's
  // NAME@stageS), and data/next_step, data/replica. Empty for a run that loaded nothing.
  reference::NamedTensors loaded;
  std::vector<ActionTiming> timeline;
  // Per step, another trainer's own account of where its step went ("actions_ms": milliseconds
  // by kind, F, B, I, W, COMM, WAIT); empty for pipecheck's trainer, whose timeline says it.
  std::vector<std::map<std::string, double>> actions_ms;
  std::vector<BoundaryRecord> boundaries;  // every step's, in the order the rank met them
  std::vector<MessageRecord> messages;     // every step's, in the order the rank posted them
  std::vector<CollectiveRecord> collectives;  // every step's data-parallel all-reduces, in order
  // "rank 1", or "replica 1 rank 1" where the run has several replicas: for messages.
  std::string Who() const;
};

// A rank records one entry per parameter name; a name that two of its stages hold (the tied
// weight when a V puts the first and last stages on one rank) is recorded once per stage, the
// later stage's copy under "NAME@stageS", so the judge sees every copy, as it does copies held
// by different ranks.
std::string StageCopyKey(const std::string& name, int stage);
// The parameter a recorded key stands for: NAME for both NAME and NAME@stageS.
std::string ParameterName(const std::string& key);

// The key a layer's routing counts are recorded under: `layers.{i}.feed_forward.expert_counts`.
std::string ExpertCountsName(int64_t layer);
// The key of a layer's choices for the replica's microbatch `microbatch`:
// `layers.{i}.feed_forward.routing/{microbatch}`; RoutingMicrobatch reads the microbatch back.
std::string RoutingName(int64_t layer, int microbatch);
int RoutingMicrobatch(const std::string& name);

// Replica `replica`'s ranks of every replica's `ranks`, indexed by pipeline rank (copies).
std::vector<RankResult> ReplicaRanks(const std::vector<RankResult>& ranks, int replica);

// Packs a rank's result into bytes and back (for sending it to rank 0).
torch::Tensor SerializeRankResult(const RankResult& result);
RankResult DeserializeRankResult(const torch::Tensor& bytes);

// Rank 0 receives every other rank's result; other ranks send theirs and wait for rank 0's
// acknowledgement before returning. Returns all results (indexed by rank) on rank 0, an empty
// vector elsewhere.
std::vector<RankResult> GatherResults(Transport& transport, RankResult own);

// Every replica's results on replica 0's rank 0, over the data-parallel group of pipeline rank 0
// (the replicas' rank 0s): `own` is this replica's GatherResults. Returns every replica's
// results, replica by replica, each indexed by pipeline rank, on replica 0; an empty vector
// elsewhere.
std::vector<RankResult> GatherReplicas(Transport& replicas, std::vector<RankResult> own);

}  // namespace pipecheck::pipeline
