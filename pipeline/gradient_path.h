// What a step does with its gradients once the schedule's actions are done, as a list of stages:
// the tied weight's two gradients summed, the average across replicas, the global-norm clip, the
// optimizer step. The trainer runs the list in order; a fault changes the list (reorders, drops,
// alters or adds a stage: Fault::EditGradientPath), never the code that runs it.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace pipecheck::pipeline {

enum class GradientOp {
  kTiedSum,         // the tied weight's gradients summed between the first and last stage
  kReplicaAverage,  // the replicas' average (data parallelism; nothing with one replica)
  kClip,            // scaled by the global-norm clip factor; the norm before clipping is recorded
  kOptimizerStep,   // each stage's optimizer steps (after the step's gradients are recorded)
  kTransform        // `transform` on this rank's parameters (a fault's own stage)
};

// What a transform sees.
struct GradientContext {
  const std::vector<torch::Tensor>& parameters;  // this rank's, with the tied copy
  std::chrono::steady_clock::time_point step_started;
};

struct GradientStage {
  GradientOp op = GradientOp::kTransform;
  // kReplicaAverage (the replicas' sum, which is their average: each replica's loss is divided by
  // the whole global batch's tokens): whether the tied weight's last-stage copy is averaged beside
  // the first stage's (else it counts once, as in the clipping norm); whether it is issued once
  // microbatch 0's backward is done instead of after the last backward.
  bool tied_copy_averaged = true;
  bool after_first_microbatch = false;
  // With a mixture of experts: whether a replica that has no gradient for a parameter (an expert
  // none of its tokens chose) is left without one after the average, as if it had skipped it,
  // instead of taking the replicas' average.
  bool unrouted_skipped = false;
  // kClip: the norm over every rank (else this rank's own), with the tied weight once (else its
  // last-stage copy too).
  bool global_norm = true;
  bool tied_copy_in_norm = false;
  // kOptimizerStep: a fresh optimizer (no moments, step count 0) instead of the step's own.
  bool fresh_optimizer = false;
  // kTransform.
  std::string name;
  std::function<void(const GradientContext&)> transform;
};

using GradientPath = std::vector<GradientStage>;

// The correct path: tied sum, replica average, clip, optimizer step.
GradientPath CorrectGradientPath();

// The first stage of `op` in `path`, or nullptr.
GradientStage* Find(GradientPath& path, GradientOp op);

// `path` without its stages of `op`.
void Drop(GradientPath& path, GradientOp op);

// The first stage of `op`, taken out of `path` (to be put back elsewhere: a reordering).
GradientStage Take(GradientPath& path, GradientOp op);

}  // namespace pipecheck::pipeline
