// Which layers each pipeline stage holds. Stages with no layers are legal: they still pass
// activations on, and the first/last stage still embed / apply the head.
// Not placement: which rank runs a stage is the schedule's business (schedule.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/model.h"
#include "reference/model_config.h"

namespace pipecheck::pipeline {

// Layer counts per stage for `spec`: "uniform" (the first layers % stages stages get one
// more), "params" (contiguous split minimising the largest stage's parameter count, embedding
// and head included), or explicit counts "2;0;3;1". Throws c10::Error naming the spec.
std::vector<int64_t> PartitionLayers(const reference::ModelConfig& config, int64_t stages,
                                     const std::string& spec);

// The model slice of every stage: consecutive layers, embedding on stage 0, head on the last.
std::vector<reference::SliceSpec> StageSlices(const std::vector<int64_t>& layer_counts);

// Parameters a stage holds (a tied head's copy of the embedding included).
int64_t StageParameterCount(const reference::ModelConfig& config, const reference::SliceSpec& slice);

}  // namespace pipecheck::pipeline
