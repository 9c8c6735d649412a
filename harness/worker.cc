// One rank of a scenario (see worker.h).
#include "harness/worker.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "harness/errors.h"
#include "harness/parity.h"
#include "harness/scenario_model.h"
#include "pipeline/trainer.h"
#include "pipeline/transport.h"
#include "reference/memory_meter.h"
#include "reports/csv.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {
namespace {

constexpr int kExitBadInput = 2;

// Bad worker environment; reported with exit code 2.
class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string Environment(const char* name, const char* fallback_name = nullptr) {
  if (const char* value = std::getenv(name)) return value;
  if (fallback_name != nullptr) {
    if (const char* value = std::getenv(fallback_name)) return value;
  }
  throw EnvironmentError(fmt::format(
      "{} is not set: a worker needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (pipecheck run, torchrun and "
      "SLURM set them)", name));
}

int EnvironmentInteger(const char* name, const char* fallback_name = nullptr) {
  const std::string text = Environment(name, fallback_name);
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw EnvironmentError(fmt::format("{}='{}' is not an integer", name, text));
}

pipeline::RendezvousOptions ReadRendezvous(int expected_world_size) {
  pipeline::RendezvousOptions options;
  options.rank = EnvironmentInteger("RANK", "SLURM_PROCID");
  options.world_size = EnvironmentInteger("WORLD_SIZE", "SLURM_NTASKS");
  if (options.world_size != expected_world_size) {
    throw EnvironmentError(fmt::format("WORLD_SIZE is {} but the scenario needs world_size {}", options.world_size,
                                       expected_world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    throw EnvironmentError(fmt::format("RANK {} is outside [0, {})", options.rank, options.world_size));
  }
  if (options.world_size > 1) {
    options.master_addr = Environment("MASTER_ADDR");
    options.master_port = EnvironmentInteger("MASTER_PORT");
  }
  return options;
}

// Rank 0's part after the pipeline: the reference, the comparison, the reports.
int FinishOnRankZero(const scenarios::Scenario& scenario, const pipeline::PipelineConfig& config,
                     const std::vector<pipeline::RankResult>& ranks, const std::string& out) {
  auto train = config.train;
  train.record_gradients = true;
  reference::ReferenceTrainer reference(train);
  const auto reference_result = reference.Train();
  const auto simulation = pipeline::ValidateSchedule(pipeline::BuildSchedule(config));
  const auto report = CompareWithReference({scenario, reference_result, ranks, simulation});
  std::filesystem::create_directories(out);
  reports::WriteReports(out, {report});
  reports::WriteFileAtomically((std::filesystem::path(out) / kResultFile).string(), reports::ToJson(report));
  fmt::print("{} {}: {}\n", scenario.name, report.Get("status"), report.Get("message"));
  return report.Get("ok") == "1" ? 0 : 1;
}

}  // namespace

int RunWorker(const WorkerOptions& options) {
  reference::StartMemoryMeter();  // before anything is allocated, so every tensor is counted
  // For messages only, until the environment is validated below.
  const char* rank_text = std::getenv("RANK") ? std::getenv("RANK") : std::getenv("SLURM_PROCID");
  std::string rank = rank_text ? rank_text : "?";
  try {
    const auto suite = scenarios::LoadScenarios(options.scenarios_path);
    const auto& scenario = scenarios::FindScenario(suite, options.scenario, options.scenarios_path);
    const auto config = ToPipelineConfig(scenario);
    const auto rendezvous = ReadRendezvous(config.world_size);
    rank = std::to_string(rendezvous.rank);
    if (options.threads > 0) {
      at::set_num_threads(options.threads);
      at::set_num_interop_threads(1);
    }
    auto transport = pipeline::ConnectGloo(rendezvous);
    pipeline::PipelineTrainer trainer(config, *transport);
    auto results = pipeline::GatherResults(*transport, trainer.Train());
    if (rendezvous.rank != 0) return 0;
    return FinishOnRankZero(scenario, config, results, options.out);
  } catch (const scenarios::ScenarioError& error) {
    fmt::print(stderr, "pipecheck worker: {}\n", error.what());
    return kExitBadInput;
  } catch (const EnvironmentError& error) {
    fmt::print(stderr, "pipecheck worker: {}\n", error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck worker rank {}: {}\n", rank, ErrorMessage(error));
    return 1;
  }
}

}  // namespace pipecheck::harness
