// What one rank of the pipeline reports about a run (losses, gradients and weights per step,
// timings, peak memory, its executed actions), and how it travels to rank 0: packed as a
// pickled dict over the transport. Not a judge: harness/parity.h compares it.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "pipeline/comm_record.h"
#include "pipeline/schedule.h"
#include "pipeline/transport.h"
#include "reference/fingerprint.h"
#include "reference/trainer.h"

namespace pipecheck::pipeline {

// One action as executed: for timelines and measured bubbles.
struct ActionTiming {
  int64_t step = 0;
  Action action;
  double start_us = 0.0;  // since the step started
  double end_us = 0.0;
  int64_t held_bytes = -1;  // tensor bytes the trainer held right after the action; -1 unmetered
  int64_t peak_bytes = -1;  // the most it held from the action's start (its wait included) to its end
  double wait_start_us = 0.0;  // since the step started: when it began waiting for its input (= start_us: no wait)
  double step_start_us = 0.0;  // when the step started, on the run's clock (see Executor::StartClock)
};

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

// What one rank produced over the whole run.
struct RankResult {
  int rank = 0;
  std::vector<int> stages;
  std::vector<double> losses;      // per step; only the last stage's rank knows them (NaN elsewhere)
  std::vector<double> step_ms;     // per step, this rank's wall time
  std::vector<double> grad_norms;  // per step, global norm before clipping
  std::vector<int64_t> peak_bytes; // per step, tensor bytes this rank held at most; -1 unmetered
  std::vector<reference::NamedTensors> gradients;  // per step, as applied (after tied sum and clipping)
  std::vector<reference::NamedTensors> weights;    // per step, the weights the step started from
  reference::NamedTensors final_weights;
  std::vector<ActionTiming> timeline;
  std::vector<BoundaryRecord> boundaries;  // every step's, in the order the rank met them
  std::vector<MessageRecord> messages;     // every step's, in the order the rank posted them
};

// A rank records one entry per parameter name; a name that two of its stages hold (the tied
// weight when a V puts the first and last stages on one rank) is recorded once per stage, the
// later stage's copy under "NAME@stageS", so the judge sees every copy, as it does copies held
// by different ranks.
std::string StageCopyKey(const std::string& name, int stage);
// The parameter a recorded key stands for: NAME for both NAME and NAME@stageS.
std::string ParameterName(const std::string& key);

// Packs a rank's result into bytes and back (for sending it to rank 0).
torch::Tensor SerializeRankResult(const RankResult& result);
RankResult DeserializeRankResult(const torch::Tensor& bytes);

// Rank 0 receives every other rank's result; other ranks send theirs and wait for rank 0's
// acknowledgement before returning. Returns all results (indexed by rank) on rank 0, an empty
// vector elsewhere.
std::vector<RankResult> GatherResults(Transport& transport, RankResult own);

}  // namespace pipecheck::pipeline
