// What each rank should hold, predicted from the schedule and tensor sizes alone: parameters,
// gradients (fp32 sums under bfloat16), optimizer state, the batch, and for every action the
// activations kept for backward, the receive buffers posted, and the send buffers not yet
// released, walked through the rank's action list step by step. Its peak is reported beside
// the measured peak, so a leak (a buffer held longer than the discipline allows) shows up as
// measured above predicted.
//
// Activations kept for backward are counted per layer as the tensors LibTorch's autograd saves
// for this model's ops (reference/layers.cc): for a microbatch of b sequences of t positions
// (N = b*t tokens), element size e and norm-statistics size s (float32 under bfloat16):
//   llama layer: (8e + 2s)·N·hidden + 4e·N·ffn + e·b·heads·t² (softmax) + b·t² (mask) + 2s·N
//   gpt2 layer:  (8e + 2s)·N·hidden + 2e·N·ffn + the same attention and norm terms
//   head:        (2e + s)·N·hidden + N·vocab in the loss dtype + s·N
//   a mixture-of-experts layer: the llama layer less its MLP's 4e·N·ffn, plus what its router
//     keeps (scores, sort indices, the gates' operands) and, per dispatched slot (top_k per
//     token within its sequence's length), the expert's saved rows (memory_model.cc MlpRetained)
// checked against the counting allocator (exact on every flavour and dtype; within 24 bytes a
// microbatch with experts).
// Transient peaks inside an action (attention scores, logits gradients, optimizer temporaries)
// are estimated, and reported per action beside the allocator's (timeline.csv): a zero-bubble
// I keeps the whole graph for W, so two score-sized gradients come on top of everything the
// forward saved (exact on the CPU); stage 0's I computes nothing; the clip squares no copy of a
// tied weight. A backward that makes the parameters' gradients (the first of a step; under
// bfloat16 every one) holds those made so far beside each op's transient, which decides its peak
// where few tokens meet a wide hidden; a head-only stage's backward peaks in the output
// projection's (its weight's gradient) or the final norm's (a chain of (N, hidden) gradients in
// statistics precision) as often as in the logits'. Not a measurement: nothing here allocates a
// tensor of the model.
#pragma once

#include <cstdint>
#include <vector>

#include "pipeline/schedule.h"
#include "pipeline/stage.h"

namespace pipecheck::pipeline {

struct MemoryPrediction {
  std::vector<int64_t> peak_bytes;                          // per rank, over every step
  std::vector<int64_t> params;                              // per rank: the parameter elements its stages hold
  std::vector<std::vector<std::vector<int64_t>>> held_after;  // [step][rank][action]: after each action
  std::vector<std::vector<std::vector<int64_t>>> peak_during; // [step][rank][action]: the most held during it
};

// `schedule` is the lowered schedule the ranks run (BuildSchedule).
MemoryPrediction PredictMemory(const PipelineConfig& config, const Schedule& schedule);

// One microbatch as the memory model sees it: its sequences and its padded positions.
struct MicrobatchShape {
  int64_t sequences = 0;
  int64_t time = 0;
  int64_t tokens = 0;  // positions within their sequences' lengths (a mixture of experts dispatches these)
};

// A step's data for this replica (config.replica): its microbatches' shapes and the bytes the
// batch and its microbatches hold, worked out from the sequence lengths alone (no tokens made):
// the same storage as ReplicaMicrobatches(MakeBatch(...)) keeps.
struct StepShapes {
  std::vector<MicrobatchShape> microbatches;
  int64_t batch_bytes = 0;
};
StepShapes StepShapesOf(const PipelineConfig& config, int64_t step);

// A floor on the reference's peak, in double so that no size can overflow it: its parameters,
// and what every layer and the head keep for the backward of step 0's whole batch at once
// (the terms above, transients and optimizer state left out). Cheap whatever the sizes: for
// refusing a scenario before the exact model, whose int64 sums it keeps within range.
struct ReferenceFloor {
  double weights = 0;      // the parameters
  double activations = 0;  // every layer's and the head's, for the whole batch
  double attention = 0;    // of those, the score-sized ones (b x heads x t^2 and the masks)
  double total() const { return weights + activations; }
};
ReferenceFloor ReferenceFloorOf(const PipelineConfig& config);

}  // namespace pipecheck::pipeline
