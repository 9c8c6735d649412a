// Layer partitioning (see partition.h).
#include "pipeline/partition.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <sstream>

namespace pipecheck::pipeline {
namespace {

std::vector<int64_t> UniformCounts(int64_t layers, int64_t stages) {
  std::vector<int64_t> counts(stages, layers / stages);
  for (int64_t i = 0; i < layers % stages; ++i) ++counts[i];
  return counts;
}

std::vector<int64_t> ExplicitCounts(const reference::ModelConfig& config, int64_t stages, const std::string& spec) {
  std::vector<int64_t> counts;
  std::stringstream stream(spec);
  std::string item;
  while (std::getline(stream, item, ';')) {
    size_t used = 0;
    int64_t count = -1;
    try {
      count = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used == item.size() && count >= 0, "partition '", spec, "': '", item,
                "' is not a layer count (uniform, params, or counts such as 2;0;3;1)");
    counts.push_back(count);
  }
  int64_t total = 0;
  for (int64_t count : counts) total += count;
  TORCH_CHECK(static_cast<int64_t>(counts.size()) == stages, "partition '", spec, "' gives ", counts.size(),
              " stages, the pipeline has ", stages);
  TORCH_CHECK(total == config.layers, "partition '", spec, "' adds up to ", total, " layers, the model has ",
              config.layers);
  return counts;
}

// Contiguous split minimising the largest stage's parameter count (dynamic programming over
// (stage, layers placed so far)); ties go to the split that gives earlier stages fewer layers.
std::vector<int64_t> BalancedCounts(const reference::ModelConfig& config, int64_t stages) {
  const int64_t layers = config.layers;
  // Layers differ in size where some are mixture-of-experts layers: stage s's cost is that of
  // the layers [end - count, end) it would hold.
  auto stage_cost = [&](int64_t stage, int64_t end, int64_t count) {
    int64_t cost = config.LayersParameterCount(end - count, end);
    if (stage == 0) cost += config.EmbeddingParameterCount();
    if (stage == stages - 1) cost += config.HeadParameterCount();
    return cost;
  };
  constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max();
  // best[s][l]: smallest achievable maximum over stages 0..s holding layers [0, l).
  std::vector<std::vector<int64_t>> best(stages, std::vector<int64_t>(layers + 1, kInfinite));
  std::vector<std::vector<int64_t>> choice(stages, std::vector<int64_t>(layers + 1, 0));
  for (int64_t l = 0; l <= layers; ++l) best[0][l] = stage_cost(0, l, l), choice[0][l] = l;
  for (int64_t s = 1; s < stages; ++s) {
    for (int64_t l = 0; l <= layers; ++l) {
      for (int64_t count = l; count >= 0; --count) {  // more layers on this stage first
        const int64_t cost = std::max(best[s - 1][l - count], stage_cost(s, l, count));
        if (cost < best[s][l]) best[s][l] = cost, choice[s][l] = count;
      }
    }
  }
  std::vector<int64_t> counts(stages);
  for (int64_t s = stages - 1, l = layers; s >= 0; --s) {
    counts[s] = choice[s][l];
    l -= counts[s];
  }
  return counts;
}

}  // namespace

std::vector<int64_t> PartitionLayers(const reference::ModelConfig& config, int64_t stages, const std::string& spec) {
  TORCH_CHECK(stages >= 1, "a pipeline needs at least one stage, got ", stages);
  if (spec == "uniform") return UniformCounts(config.layers, stages);
  if (spec == "params") return BalancedCounts(config, stages);
  return ExplicitCounts(config, stages, spec);
}

std::vector<reference::SliceSpec> StageSlices(const std::vector<int64_t>& layer_counts) {
  std::vector<reference::SliceSpec> slices;
  int64_t first = 0;
  for (size_t stage = 0; stage < layer_counts.size(); ++stage) {
    slices.push_back({first, first + layer_counts[stage], stage == 0, stage + 1 == layer_counts.size()});
    first += layer_counts[stage];
  }
  return slices;
}

int64_t StageParameterCount(const reference::ModelConfig& config, const reference::SliceSpec& slice) {
  int64_t count = config.LayersParameterCount(slice.first_layer, slice.end_layer);
  if (slice.has_embedding) count += config.EmbeddingParameterCount();
  if (slice.has_head) {
    count += config.HeadParameterCount();
    // One stage holding both ends of a tied model has one shared matrix, not two.
    if (slice.has_embedding && config.tied) count -= config.vocab * config.hidden;
  }
  return count;
}

}  // namespace pipecheck::pipeline
