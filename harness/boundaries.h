// The first-divergence judge: every tensor that crossed a stage boundary (an activation going
// forward, a gradient coming back), as each rank fingerprinted it, against the same boundary cut
// out of the reference at the same weights, microbatch by microbatch; and what one rank sent
// against what the other received. Its verdict names the earliest wrong boundary tensor of a
// step in the order data flows (microbatch, then forward through the stages and back), which is
// where a wrong gradient or loss started. Not a judge of parameters: parity.h judges those.
#pragma once

#include <string>
#include <vector>

#include "pipeline/rank_result.h"
#include "reference/data.h"
#include "reference/model.h"
#include "reference/trainer.h"
#include "reports/report.h"

namespace pipecheck::harness {

struct BoundaryInput {
  const std::string& scenario;
  size_t step;
  const std::vector<pipeline::RankResult>& ranks;      // their `boundaries` for this step are judged
  const reference::StepRecord& reference;              // at the pipeline's weights, with boundaries tapped
  const reference::Batch& batch;                       // the step's whole batch
  int microbatches;
  const std::vector<reference::SliceSpec>& slices;     // every stage's layers
  torch::ScalarType dtype;
  double tol;
};

struct BoundaryVerdict {
  std::vector<reports::BoundaryRow> rows;  // boundaries.csv's rows
  std::string first_problem;                   // empty when every boundary matches
};

BoundaryVerdict JudgeBoundaries(const BoundaryInput& input);

// A microbatch's rows of the batch and the length it is padded to (its longest sequence), as
// reference::SplitMicrobatches cuts them: the shape of its boundary tensors.
struct MicrobatchCut {
  int64_t start = 0, size = 0, time = 0;
};
std::vector<MicrobatchCut> CutMicrobatches(const reference::Batch& batch, int64_t microbatches);

// The layers whose incoming hidden state is a boundary: stage s >= 1 starts at slices[s].first_layer.
std::vector<int64_t> BoundaryLayers(const std::vector<reference::SliceSpec>& slices);

}  // namespace pipecheck::harness
