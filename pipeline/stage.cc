// A rank's stages (see stage.h).
#include "pipeline/stage.h"

#include "pipeline/partition.h"
#include "reference/optimizer.h"

namespace pipecheck::pipeline {

std::vector<reference::SliceSpec> StageSlicesOf(const PipelineConfig& config, const PipelineShape& shape) {
  return StageSlices(PartitionLayers(config.train.model, shape.stages(), config.partition));
}

CostModel UnitCosts(const PipelineConfig& config) {
  CostModel costs;
  if (config.recompute) {
    costs.backward += costs.forward;
    costs.backward_input += costs.forward;
  }
  return costs;
}

std::vector<reference::Batch> ReplicaMicrobatches(const PipelineConfig& config, const reference::Batch& batch) {
  auto parts = reference::SplitMicrobatches(batch, static_cast<int64_t>(config.data_parallel) * config.microbatches);
  if (config.data_parallel == 1) return parts;
  const auto first = parts.begin() + static_cast<std::ptrdiff_t>(config.replica) * config.microbatches;
  return {first, first + config.microbatches};
}

Stages BuildStages(const PipelineConfig& config, const PipelineShape& shape, int rank) {
  const auto& model = config.train.model;
  const auto slices = StageSlicesOf(config, shape);
  Stages stages;
  for (int s = 0; s < shape.stages(); ++s) {
    if (shape.RankOfStage(s) != rank) continue;
    auto stage = std::make_unique<Stage>();
    stage->index = s;
    stage->slice = slices[s];
    stage->module = reference::BuildSlice(model, slices[s], config.train.seed, config.train.dtype, config.train.device);
    stage->parameters = stage->module->parameters();
    stage->optimizer = reference::MakeOptimizer(config.train.optimizer, stage->parameters);
    stages.push_back(std::move(stage));
  }
  return stages;
}

Stage& StageAt(const Stages& stages, int stage, int rank) {
  for (const auto& candidate : stages) {
    if (candidate->index == stage) return *candidate;
  }
  TORCH_CHECK(false, "rank ", rank, " does not hold stage ", stage);
}

std::vector<torch::Tensor> OwnedParameters(const Stages& stages, bool tied, bool count_tied_copy) {
  std::vector<torch::Tensor> parameters;
  for (const auto& stage : stages) {
    for (const auto& item : stage->module->named_parameters()) {
      const bool tied_copy =
          tied && stage->slice.has_head && !stage->slice.has_embedding && item.key() == "tok_embeddings.weight";
      if (count_tied_copy || !tied_copy) parameters.push_back(item.value());
    }
  }
  return parameters;
}

}  // namespace pipecheck::pipeline
