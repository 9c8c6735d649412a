// The gradient path's correct list and its edits (see gradient_path.h).
#include "pipeline/gradient_path.h"

#include <algorithm>
#include <stdexcept>

namespace pipecheck::pipeline {

GradientPath CorrectGradientPath() {
  GradientPath path(4);
  path[0].op = GradientOp::kTiedSum;
  path[1].op = GradientOp::kReplicaAverage;
  path[2].op = GradientOp::kClip;
  path[3].op = GradientOp::kOptimizerStep;
  return path;
}

GradientStage* Find(GradientPath& path, GradientOp op) {
  const auto found = std::find_if(path.begin(), path.end(), [op](const GradientStage& stage) { return stage.op == op; });
  return found == path.end() ? nullptr : &*found;
}

void Drop(GradientPath& path, GradientOp op) {
  path.erase(std::remove_if(path.begin(), path.end(), [op](const GradientStage& stage) { return stage.op == op; }),
             path.end());
}

GradientStage Take(GradientPath& path, GradientOp op) {
  const auto found = std::find_if(path.begin(), path.end(), [op](const GradientStage& stage) { return stage.op == op; });
  if (found == path.end()) throw std::logic_error("the gradient path has no such stage to take");
  GradientStage stage = *found;
  path.erase(found);
  return stage;
}

}  // namespace pipecheck::pipeline
