// One rank's pipeline stages: each a slice of the model (embedding?, layers [a, b), head?)
// under the reference's global names and initial values, with its parameters and its own
// optimizer state. Also the pipeline's configuration, shared by the executor and the
// gradient synchronisation. Not an executor: stages only hold state.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/faults.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "reference/model.h"
#include "reference/trainer.h"

namespace pipecheck::pipeline {

struct PipelineConfig {
  reference::TrainConfig train;  // model, data, optimizer, seed, steps, clip, dtype, device
  int world_size = 1;
  int virtual_stages = 1;
  // This replica's microbatches of one optimizer step, every round's: `accumulation` rounds of
  // the schedule, each over microbatches / accumulation of them (round k takes microbatches
  // k x that .. (k + 1) x that - 1). Their gradients add up before the step's one update.
  int microbatches = 1;
  int accumulation = 1;
  std::string schedule = "1f1b";
  std::string partition = "uniform";
  std::string fault = "none";  // a known bug to inject (faults.h); none in every real run
  // How the transport's messages wait (simulator.h): kDeviceStreams on nccl, where the schedule
  // is also validated on NCCL's channels and streams.
  CommunicationModel communication = CommunicationModel::kHost;
  // Where this rank appends each action's start and end as they happen (flight_recorder.h), so a
  // crash or hang can be explained; "" records nothing.
  std::string flight_record;
  // Replicas of this pipeline (PP x DP) and which one this rank's is. Each replica trains on its
  // own `microbatches` of the global batch's data_parallel x microbatches (ReplicaMicrobatches);
  // after the last backward every stage's gradients are averaged across its replicas.
  int data_parallel = 1;
  int replica = 0;
  // Each stage keeps only its input in the forward and runs the forward again in its backward.
  bool recompute = false;
  // Timed steps wanted for a within-run spread of tokens/s: where the judged steps time fewer
  // (the first is a warm-up), timing-only steps follow them (PipelineTrainer::Train); 0 none.
  int timed_samples = 0;
  // Resumption (scenario column `resume`): the first step this run trains (the steps before it
  // were an earlier run's, at its own layout), the checkpoint folder it starts from ("": the
  // initial weights), and the one it writes after its last step ("": none). checkpoint.h.
  int64_t first_step = 0;
  std::string load_checkpoint;
  std::string save_checkpoint;
};

// The simulator's unit costs for this configuration: a forward 1, a backward 1 (I and W a half
// each); recomputation runs the forward again at the start of every B and I, so each takes a
// forward's cost more.
CostModel UnitCosts(const PipelineConfig& config);

// The microbatches replica `config.replica` trains on: its `microbatches` contiguous ones of the
// global batch split into data_parallel x microbatches (sizes differ by at most one; each padded
// to its own longest sequence). At data_parallel 1: the batch's microbatches.
std::vector<reference::Batch> ReplicaMicrobatches(const PipelineConfig& config, const reference::Batch& batch);

struct Stage {
  int index = 0;
  reference::SliceSpec slice;
  reference::TransformerSlice module{nullptr};
  std::vector<torch::Tensor> parameters;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

using Stages = std::vector<std::unique_ptr<Stage>>;  // a rank's stages, ascending

// Every stage's slice of the model (layers, embedding, head), partitioned as the configuration says.
std::vector<reference::SliceSpec> StageSlicesOf(const PipelineConfig& config, const PipelineShape& shape);

// The stages `shape` places on `rank`, partitioned as the configuration says.
Stages BuildStages(const PipelineConfig& config, const PipelineShape& shape, int rank);

// The stage with index `stage` among `stages`; an error naming `rank` if it is not there.
Stage& StageAt(const Stages& stages, int stage, int rank);

// Every parameter the stages own. With a tied embedding, the last stage's copy of
// tok_embeddings.weight is the same weight as stage 0's: `count_tied_copy` includes it.
std::vector<torch::Tensor> OwnedParameters(const Stages& stages, bool tied, bool count_tied_copy);

}  // namespace pipecheck::pipeline
