// Pre-flight memory check (see preflight.h).
#include "harness/preflight.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <numeric>

#include "harness/scenario_model.h"
#include "pipeline/memory_model.h"
#include "pipeline/trainer.h"
#include "reference/device.h"

namespace pipecheck::harness {
namespace {

// A number from a file such as /sys/fs/cgroup/memory.max; none for "max", absence or junk.
std::optional<int64_t> NumberIn(const std::string& path) {
  std::ifstream stream(path);
  int64_t value = 0;
  if (stream >> value) return value;
  return std::nullopt;
}

// The reference: the whole model on one device, the whole batch at once (world size 1, one
// microbatch): the memory model's figure for exactly that pipeline.
int64_t ReferencePeak(const pipeline::PipelineConfig& config) {
  pipeline::PipelineConfig whole = config;
  whole.world_size = 1;
  whole.virtual_stages = 1;
  whole.microbatches = 1;
  whole.accumulation = 1;
  whole.data_parallel = 1;
  whole.recompute = false;
  whole.schedule = "gpipe";
  whole.partition = "uniform";
  whole.fault = "none";
  return pipeline::PredictMemory(whole, pipeline::BuildSchedule(whole)).peak_bytes.at(0);
}

}  // namespace

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (bytes >= 1000.0 && unit < 5) {
    bytes /= 1000.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[unit]);
}

int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  int64_t available = 0;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") available = kilobytes * 1024;
  }
  const auto limit = NumberIn("/sys/fs/cgroup/memory.max");
  const auto used = NumberIn("/sys/fs/cgroup/memory.current");
  if (limit && used) available = std::min(available, std::max<int64_t>(0, *limit - *used));
  return available;
}

std::vector<MemoryNeed> MemoryNeeds(const scenarios::Scenario& scenario) {
  // Sized as the trainer without its injected fault: a fault such as send_before_recv makes a
  // schedule that deadlocks, which the run itself must show, not this check.
  auto config = ToPipelineConfig(scenario);
  config.fault = "none";
  const auto prediction = pipeline::PredictMemory(config, pipeline::BuildSchedule(config));
  const int64_t reference = ReferencePeak(config);
  // Rank 0 keeps every rank's weights and gradients of every step for parity, in the model dtype.
  const auto& model = config.train.model;
  const double parameters = static_cast<double>(model.ParameterCount());
  const int64_t element = static_cast<int64_t>(c10::elementSize(config.train.dtype));
  const int64_t copies = static_cast<int64_t>(parameters) * element * (2 * scenario.steps + 1) * scenario.data_parallel;

  std::map<std::string, MemoryNeed> needs;  // by place
  std::map<std::string, std::vector<std::string>> parts;
  const int gpus = scenario.device == "cuda" ? std::max(1, reference::CudaDeviceCount()) : 0;
  auto place_of = [&](int rank) { return gpus == 0 ? std::string("host memory") : fmt::format("cuda:{}", rank % gpus); };
  // Every replica holds what replica 0 does (give or take a sequence of its shard).
  const int ranks = static_cast<int>(prediction.peak_bytes.size());
  for (int replica = 0; replica < config.data_parallel; ++replica) {
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string place = place_of(replica * ranks + rank);
      needs[place].needed += prediction.peak_bytes[rank];
      parts[place].push_back(fmt::format("{}rank {} {}", config.data_parallel > 1 ? fmt::format("replica {} ", replica) : "",
                                         rank, HumanBytes(static_cast<double>(prediction.peak_bytes[rank]))));
    }
  }
  // The reference trains on rank 0's device after the pipeline, beside the pipeline's stages.
  needs[place_of(0)].needed += reference;
  parts[place_of(0)].push_back(fmt::format("the reference {}", HumanBytes(static_cast<double>(reference))));
  needs["host memory"].needed += copies;
  parts["host memory"].push_back(fmt::format("rank 0's recorded weights and gradients {}",
                                             HumanBytes(static_cast<double>(copies))));
  std::vector<MemoryNeed> result;
  for (auto& [place, need] : needs) {
    need.where = place;
    need.detail = fmt::format("{}", fmt::join(parts[place], " + "));
    need.available = place == "host memory" ? AvailableHostBytes() : reference::DeviceTotalBytes(std::stoi(place.substr(5)));
    result.push_back(need);
  }
  return result;
}

std::string MemoryProblem(const scenarios::Scenario& scenario) {
  for (const auto& need : MemoryNeeds(scenario)) {
    if (need.needed <= need.available) continue;
    return fmt::format("scenario '{}' needs at least {} of {} ({}, predicted by the memory model), but {} {} "
                       "available: it cannot run here; make it smaller, or run it on a larger machine",
                       scenario.name, HumanBytes(static_cast<double>(need.needed)), need.where,
                       need.detail, HumanBytes(static_cast<double>(need.available)),
                       need.where == "host memory" ? "are" : "is all that device has");
  }
  return "";
}

}  // namespace pipecheck::harness
