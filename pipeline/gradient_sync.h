// What happens between a step's last backward and its optimizer step, across ranks: the tied
// embedding's two gradients summed between their owners (bitwise identically on both), and
// clipping by the global gradient norm over every stage with the tied weight counted once.
// The stages of the gradient path (gradient_path.h) that the trainer runs with these. Not the
// optimizer: stages apply their own.
#pragma once

#include <map>

#include "pipeline/gradient_path.h"
#include "pipeline/stage.h"
#include "pipeline/transport.h"

namespace pipecheck::pipeline {

// Sums the tied weight's gradients of the first and last stage on both owners (no-op untied).
void SyncTiedGradients(const Stages& stages, const PipelineConfig& config, const PipelineShape& shape,
                       Transport& transport);

// The ordered pairs of ranks the tied sum sends over: both ways between the first and last
// stage's ranks when they differ; none otherwise.
std::vector<std::pair<int, int>> TiedChannels(const PipelineConfig& config, const PipelineShape& shape);

// Combines `parameters`' gradients across the replicas (the data-parallel group `replicas`): one
// flat bucket per dtype, summed by an all-reduce (the same bits on every replica; each replica's
// loss was divided by the whole batch's tokens, so the sum is the average), then copied back. Each of `alone` (gradients among `parameters`
// that another rank of the pipeline also averages: a tied weight's copies) goes in a bucket of
// its own, so both owners all-reduce the same tensor of the same size and get the same bits
// (Gloo's ring sums each chunk of a bucket in an order that depends on where the chunk lies: a
// copy at different offsets of two ranks' buckets would come out different past two replicas).
// The buckets persist in `buckets` from step to step, as DDP's do: allocated once, so what the
// rank holds does not depend on when c10d's worker thread lets go of a finished all-reduce's
// tensor. Returns the elements and bytes each replica contributed.
struct ReplicaTraffic {
  int64_t elements = 0;
  int64_t bytes = 0;
};
using ReplicaBuckets = std::map<std::string, torch::Tensor>;
// `sparse`: a parameter may have no gradient on some replicas (a mixture of experts' expert that
// none of a replica's tokens chose). The replicas then agree first on which parameters have one
// anywhere. Every replica averages every parameter (zeros where it has no gradient, so that the
// buckets match, as DDP's do); one that no replica has a gradient for is left without one after
// the average, as the reference leaves an expert no token of the whole batch chose.
// `unrouted_skipped` (a fault): a replica's parameter that had no gradient before the average has
// none after it either.
ReplicaTraffic AverageAcrossReplicas(const std::vector<torch::Tensor>& parameters,
                                     const std::vector<torch::Tensor>& alone, Transport& replicas,
                                     ReplicaBuckets& buckets, bool sparse = false, bool unrouted_skipped = false);

// The tied weight's copies this rank holds (none untied): what AverageAcrossReplicas takes alone.
std::vector<torch::Tensor> TiedCopies(const Stages& stages, const PipelineConfig& config);

// Scales every owned gradient by the clip factor of the norm `clip` says (the global norm, the
// tied weight once, when correct); returns the norm before clipping. Every rank's norm is
// gathered whatever `clip` says, so the ranks' collectives stay matched.
double ClipGradients(const Stages& stages, const PipelineConfig& config, const GradientStage& clip, Transport& transport);

}  // namespace pipecheck::pipeline
