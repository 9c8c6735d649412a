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
pipeline::PipelineConfig ReferenceConfig(const pipeline::PipelineConfig& config) {
  pipeline::PipelineConfig whole = config;
  whole.world_size = 1;
  whole.virtual_stages = 1;
  whole.microbatches = 1;
  whole.accumulation = 1;
  whole.data_parallel = 1;
  whole.replica = 0;
  whole.recompute = false;
  whole.schedule = "gpipe";
  whole.partition = "uniform";
  whole.fault = "none";
  return whole;
}

// The actions of one step of a replica's schedule, without building it: each stage's forward
// and backward of every microbatch (three actions for a split backward) and a send and a
// receive each way between stages: at most 7 per stage and microbatch.
int64_t ActionsPerStep(const pipeline::PipelineConfig& config) {
  return int64_t{7} * config.world_size * config.virtual_stages * config.microbatches;
}

// What one place needs, part by part, in the order they were added.
// Each part also names the row's column it grows with, so a refusal can point at the largest.
struct Tally {
  double needed = 0;
  std::vector<std::string> parts;
  double largest = -1;
  std::string column;  // the largest part's
  void Add(double bytes, const std::string& what, const std::string& column_of_part, const std::string& after = "") {
    needed += bytes;
    parts.push_back(fmt::format("{} {}{}", what, HumanBytes(bytes), after));
    if (bytes > largest) largest = bytes, column = column_of_part;
  }
};

// A row's needs by place: host memory for cpu rows, each GPU its ranks use for cuda rows.
class Needs {
 public:
  explicit Needs(const scenarios::Scenario& scenario)
      : gpus_(scenario.device == "cuda" ? std::max(1, reference::CudaDeviceCount()) : 0) {}

  bool OnGpus() const { return gpus_ > 0; }
  std::string PlaceOf(int64_t rank) const {
    return gpus_ == 0 ? std::string("host memory") : fmt::format("cuda:{}", rank % gpus_);
  }
  Tally& At(const std::string& place) { return tallies[place]; }

  // Each place with what it needs, how that adds up (then `note`) and what it has.
  std::vector<MemoryNeed> Result(const std::string& note) const;
  bool Fits() const {
    for (const auto& need : Result("")) {
      if (need.needed > static_cast<double>(need.available)) return false;
    }
    return true;
  }

  std::map<std::string, Tally> tallies;

 private:
  int gpus_;
};

std::vector<MemoryNeed> Needs::Result(const std::string& note) const {
  std::vector<MemoryNeed> needs;
  for (const auto& [place, tally] : tallies) {
    MemoryNeed need;
    need.where = place;
    need.needed = tally.needed;
    need.detail = fmt::format("{}{}", fmt::join(tally.parts, " + "), note);
    need.column = tally.column;
    need.available = place == "host memory" ? AvailableHostBytes() : reference::DeviceTotalBytes(std::stoi(place.substr(5)));
    needs.push_back(need);
  }
  return needs;
}

// What every run of the row holds whatever its schedule: its processes, and rank 0's copies of
// every rank's weights and gradients of every step for parity, in the model dtype.
void AddEveryRunsNeeds(const scenarios::Scenario& scenario, double weights, Needs& needs) {
  const int64_t processes = scenario.Processes();
  needs.At("host memory").Add(static_cast<double>(processes) * kProcessOverheadBytes,
                              fmt::format("{} process{}", processes, processes == 1 ? "" : "es"),
                              scenario.data_parallel > scenario.world_size ? "data_parallel" : "world_size",
                              processes == 1 ? "" : fmt::format(" ({} each)", HumanBytes(kProcessOverheadBytes)));
  needs.At("host memory").Add(weights * static_cast<double>(2 * scenario.steps + 1) *
                                  static_cast<double>(scenario.data_parallel),
                              "rank 0's recorded weights and gradients", scenario.steps > 10 ? "steps" : "hidden");
}

// Each rank's predicted peak at its place; every replica holds what replica 0 does (give or take
// a sequence of its shard). Many ranks: a sum per place, and the rank that needs the most.
void AddRankPeaks(const pipeline::PipelineConfig& config, const pipeline::MemoryPrediction& prediction, Needs& needs) {
  const int ranks = static_cast<int>(prediction.peak_bytes.size());
  const int64_t all = static_cast<int64_t>(ranks) * config.data_parallel;
  if (all <= 4) {
    for (int replica = 0; replica < config.data_parallel; ++replica) {
      for (int rank = 0; rank < ranks; ++rank) {
        needs.At(needs.PlaceOf(int64_t{replica} * ranks + rank))
            .Add(static_cast<double>(prediction.peak_bytes[rank]),
                 fmt::format("{}rank {}", config.data_parallel > 1 ? fmt::format("replica {} ", replica) : "", rank),
                 "batch");
      }
    }
    return;
  }
  std::map<std::string, std::pair<double, int64_t>> per_place;  // bytes, ranks
  for (int64_t index = 0; index < all; ++index) {
    auto& [bytes, count] = per_place[needs.PlaceOf(index)];
    bytes += static_cast<double>(prediction.peak_bytes[index % ranks]);
    ++count;
  }
  const auto most = std::max_element(prediction.peak_bytes.begin(), prediction.peak_bytes.end());
  for (const auto& [place, sum] : per_place) {
    needs.At(place).Add(sum.first, fmt::format("{} ranks (the most: rank {}, {})", sum.second,
                                               most - prediction.peak_bytes.begin(),
                                               HumanBytes(static_cast<double>(*most))), "batch");
  }
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
  const double element = static_cast<double>(c10::elementSize(config.train.dtype));
  const double weights = static_cast<double>(config.train.model.ParameterCount()) * element;
  Needs needs(scenario);
  AddEveryRunsNeeds(scenario, weights, needs);

  // First a floor in floating point: the pipeline's weights and the reference's weights and
  // whole-batch activations. Too big already, the row is refused on it; else every figure the
  // exact model sums stays far inside int64.
  const auto exact = needs.tallies;
  if (!needs.OnGpus()) {
    needs.At("host memory").Add(weights * static_cast<double>(scenario.data_parallel),
                                config.data_parallel > 1 ? "the replicas' weights" : "the pipeline's weights", "hidden");
  }
  // The reference's part grows with the sequences' length where attention's scores are most of
  // it (t squared), else with the batch, or with the width where its weights are.
  const auto floor = pipeline::ReferenceFloorOf(config);
  const std::string grows_with = floor.weights > floor.activations ? "hidden"
                                 : 2 * floor.attention > floor.activations ? "seq_len"
                                                                           : "batch";
  needs.At(needs.PlaceOf(0)).Add(floor.total(), "the reference's weights and whole-batch activations", grows_with);
  constexpr const char* kFloor = "; a floor from the memory model's terms";
  if (!needs.Fits()) return needs.Result(kFloor);
  const int64_t per_step = ActionsPerStep(config);
  if (2 * per_step > kSizingActions) {
    return needs.Result(fmt::format("{}, the schedule's {} actions a step being too many to walk here", kFloor, per_step));
  }

  // The memory model, over as many steps as kSizingActions allows (2 at least: the first step
  // creates the optimizer state), each rank's peak and the reference's.
  config.train.steps = std::min<int64_t>(config.train.steps, std::max<int64_t>(2, kSizingActions / per_step));
  const auto schedule = pipeline::LoweredScheduleWithin(config, kLoweringBudget);
  if (!schedule) return needs.Result(fmt::format("{}, the schedule's lowering being too long a search here", kFloor));
  const auto prediction = pipeline::PredictMemory(config, *schedule);
  auto whole = ReferenceConfig(config);
  const int64_t reference = pipeline::PredictMemory(whole, *pipeline::LoweredScheduleWithin(whole, -1)).peak_bytes.at(0);
  needs.tallies = exact;
  AddRankPeaks(config, prediction, needs);
  // The reference trains on rank 0's device after the pipeline, beside the pipeline's stages.
  needs.At(needs.PlaceOf(0)).Add(static_cast<double>(reference), "the reference", grows_with);
  return needs.Result(", predicted by the memory model");
}

std::string MemoryProblem(const scenarios::Scenario& scenario) { return MemoryRefusalOf(scenario).why; }

MemoryRefusal MemoryRefusalOf(const scenarios::Scenario& scenario) {
  for (const auto& need : MemoryNeeds(scenario)) {
    if (need.needed <= static_cast<double>(need.available)) continue;
    MemoryRefusal refusal;
    refusal.place = scenarios::ValuePlace(scenario, need.column);
    refusal.why = fmt::format("scenario '{}' needs at least {} of {} ({}), but {} {} available: it cannot run here; "
                              "make it smaller, or run it on a larger machine",
                              scenario.name, HumanBytes(need.needed), need.where, need.detail,
                              HumanBytes(static_cast<double>(need.available)),
                              need.where == "host memory" ? "are" : "is all that device has");
    return refusal;
  }
  return {};
}

}  // namespace pipecheck::harness
