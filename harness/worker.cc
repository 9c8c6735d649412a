// One rank of a scenario (see worker.h).
#include "harness/worker.h"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "harness/boundaries.h"
#include "harness/errors.h"
#include "harness/external.h"
#include "harness/invariance.h"
#include "harness/parity.h"
#include "harness/plan.h"
#include "harness/scenario_model.h"
#include "pipeline/trainer.h"
#include "pipeline/transport.h"
#include "reference/device.h"
#include "reference/memory_meter.h"
#include "reports/csv.h"
#include "reports/trace.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {
namespace {

constexpr int kExitBadInput = 2;

// Bad worker environment; reported with exit code 2.
class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An environment variable's value and the name it was read under (RANK, or SLURM_PROCID under srun).
struct EnvironmentValue {
  std::string text;
  std::string name;
};

EnvironmentValue Environment(const char* name, const char* fallback_name = nullptr) {
  if (const char* value = std::getenv(name)) return {value, name};
  if (fallback_name != nullptr) {
    if (const char* value = std::getenv(fallback_name)) return {value, fallback_name};
  }
  throw EnvironmentError(fmt::format(
      "{} is not set: a worker needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (pipecheck run, torchrun and "
      "SLURM set them)", name));
}

std::pair<int, std::string> EnvironmentInteger(const char* name, const char* fallback_name = nullptr) {
  const auto [text, read_as] = Environment(name, fallback_name);
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size()) return {value, read_as};
  } catch (const std::exception&) {
  }
  throw EnvironmentError(fmt::format("{}='{}' is not an integer", read_as, text));
}

// `expected`: the scenario's processes, world_size x data_parallel; `needs` says so in words.
pipeline::RendezvousOptions ReadRendezvous(int expected_world_size, const std::string& needs, double timeout_seconds) {
  pipeline::RendezvousOptions options;
  const auto [rank, rank_name] = EnvironmentInteger("RANK", "SLURM_PROCID");
  const auto [world_size, world_size_name] = EnvironmentInteger("WORLD_SIZE", "SLURM_NTASKS");
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  if (options.world_size != expected_world_size) {
    throw EnvironmentError(fmt::format("{} is {} but the scenario needs {}", world_size_name, options.world_size, needs));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    throw EnvironmentError(fmt::format("{} {} is outside [0, {}) ({} {})", rank_name, options.rank, options.world_size,
                                       world_size_name, options.world_size));
  }
  if (options.world_size > 1) {
    options.master_addr = Environment("MASTER_ADDR").text;
    options.master_port = EnvironmentInteger("MASTER_PORT").first;
    if (options.master_port < 1 || options.master_port > 65535) {
      throw EnvironmentError(fmt::format("MASTER_PORT={} is not a TCP port (1 to 65535)", options.master_port));
    }
    // Under torchrun (without --standalone too) the elastic agent already serves the store on
    // MASTER_PORT; rank 0 then joins it as a client instead of binding the port itself.
    const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    options.serve_store = !(agent_store != nullptr && (std::string(agent_store) == "True" ||
                                                       std::string(agent_store) == "true" ||
                                                       std::string(agent_store) == "1"));
  }
  return options;
}

// Connects to the other ranks. A rendezvous that does not complete in time is the environment's
// fault (no rank 0 listening, a rank never started, MASTER_ADDR/MASTER_PORT differing between
// ranks): exit 2, saying what this rank waited for.
pipeline::ProcessGroups ConnectRanks(const pipeline::RendezvousOptions& rendezvous, int pipeline_size,
                                     const std::string& transport, torch::Device device, double timeout_seconds) {
  if (rendezvous.world_size > 1) {
    fmt::print(stderr, "pipecheck: rank {} joins the rendezvous of {} ranks at {}:{} (waiting up to {:g} s)\n",
               rendezvous.rank, rendezvous.world_size, rendezvous.master_addr, rendezvous.master_port, timeout_seconds);
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    return pipeline::ConnectGroups(rendezvous, pipeline_size, transport, device);
  } catch (const std::exception& error) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string message = ErrorMessage(error);
    // A port taken before rank 0 could listen is the launcher's to retry, not a missing peer.
    if (waited < 0.9 * timeout_seconds || message.find("ddress already in use") != std::string::npos) throw;
    throw EnvironmentError(fmt::format(
        "rendezvous failed after {:.0f} s: {} at {}:{} (is rank 0 running, and do all {} ranks share MASTER_ADDR and "
        "MASTER_PORT?): {}", waited,
        rendezvous.rank == 0 ? "not every rank joined rank 0's store" : "no rank 0 answered",
        rendezvous.master_addr, rendezvous.master_port, rendezvous.world_size, message));
  }
}

// A scenario's verdict handed over: the reports and the views in `out`, result.json for the
// launcher, a line on stdout; the worker's exit code (0 met its expectation, 1 not).
int Deliver(const scenarios::Scenario& scenario, const reports::ScenarioReport& report, const std::string& out) {
  reports::WriteReports(out, {report});
  reports::WriteTimelineViews(out, report);
  reports::WriteFileAtomically((std::filesystem::path(out) / kResultFile).string(), reports::ToJson(report));
  fmt::print("{} {}: {}\n", scenario.name, reports::StatusName(report.summary.status), report.summary.message);
  return report.summary.ok ? 0 : 1;
}

// Rank 0's part after the pipeline: the reference, the comparison, the reports, all with the
// plan's schedule, simulation and memory predictions.
int FinishOnRankZero(const Plan& plan, const pipeline::PipelineConfig& config,
                     const std::vector<pipeline::RankResult>& ranks, const std::string& out, bool save_tensors) {
  auto oracle_config = config.train;
  oracle_config.boundary_layers = BoundaryLayers(pipeline::StageSlicesOf(config, plan.schedule.shape));
  // The reference cuts the global batch as the replicas do (data_parallel x microbatches), so its
  // boundary taps line up with every replica's microbatches.
  Oracle oracle(oracle_config, config.microbatches * config.data_parallel);
  ParityInput input{plan.scenario, oracle, ranks, plan.schedule, plan.simulation,
                    plan.memory.front(), /*check_communication=*/true, nullptr, &plan.memory,
                    plan.transport};
  input.segment = &plan.segment;
  const auto report = CompareWithReference(input);
  std::filesystem::create_directories(out);
  if (save_tensors) SaveTrainedTensors(FromRanks(ranks), (std::filesystem::path(out) / kTensorsFile).string());
  return Deliver(plan.scenario, report, out);
}

// A phase of another trainer's scenario (external.h): its inputs written, or its outputs judged
// into the reports and result.json, as rank 0 of pipecheck's own trainer leaves them.
int RunExternalPhase(const Plan& plan, const WorkerOptions& options) {
  std::filesystem::create_directories(options.out);
  if (options.phase == "prepare") {
    PrepareExchange(plan.scenario, plan.schedule.shape, options.out, plan.segment);
    return 0;
  }
  return Deliver(plan.scenario, JudgeExchange(plan.scenario, plan.schedule.shape, options.out, plan.segment),
                 options.out);
}

// The plan handed over (--plan), or, for a worker that torchrun or srun started, the scenario
// resolved here from its suite.
Plan WorkerPlan(const WorkerOptions& options) {
  if (!options.plan.empty()) return ReadPlan(options.plan);
  if (options.scenario.empty()) {
    throw scenarios::ScenarioError("a worker needs --plan FILE, or --scenario NAME (with --scenarios) to plan itself");
  }
  const auto suite = harness::LoadSuite(options.scenarios_path, options.device);
  const auto& scenario = scenarios::FindScenario(suite, options.scenario, options.scenarios_path);
  if (scenario.ExternalTrainer() && options.phase.empty()) {
    throw scenarios::ScenarioError(fmt::format(
        "{}: scenario '{}' is trained by trainer {}, whose ranks are its own processes: `pipecheck run` launches "
        "them between a --phase prepare and a --phase judge worker", scenario.source, scenario.name, scenario.trainer));
  }
  if (!scenario.resumes.empty()) {
    throw scenarios::ScenarioError(fmt::format(
        "{}: scenario '{}' stops and resumes ({}): `pipecheck run` launches each of its layouts in turn",
        scenario.source, scenario.name, scenario.resume));
  }
  return ResolvePlan(scenario);
}

// One rank of pipecheck's own trainer: connect, train, hand the results to rank 0, which judges.
int RunRank(const Plan& plan, const WorkerOptions& options, std::string& rank) {
  auto config = plan.config;
  const std::string needs =
      config.data_parallel == 1 ? fmt::format("world_size {}", config.world_size)
                                : fmt::format("world_size {} x data_parallel {} = {} processes", config.world_size,
                                              config.data_parallel, config.world_size * config.data_parallel);
  const auto rendezvous =
      ReadRendezvous(config.world_size * config.data_parallel, needs, options.rendezvous_timeout_seconds);
  rank = std::to_string(rendezvous.rank);
  std::filesystem::create_directories(options.out);
  config.flight_record = FlightRecordPath(options.out, rendezvous.rank);
  config.timed_samples = options.timed_steps;
  if (options.threads > 0) {
    at::set_num_threads(options.threads);
    at::set_num_interop_threads(1);
  }
  if (config.train.device.is_cuda()) {
    config.train.device = CudaDeviceOfThisRank();
    reference::MakeCurrent(config.train.device);
    reference::WarmUpDevice(config.train.device);
  }
  if (!plan.unmet.empty()) throw std::runtime_error(plan.unmet);  // `run` skips these; a worker started anyway fails
  if (!plan.error.empty()) throw std::runtime_error(plan.error);
  auto groups = ConnectRanks(rendezvous, config.world_size, plan.transport, config.train.device,
                             options.rendezvous_timeout_seconds);
  config.replica = groups.replica;
  auto& transport = groups.pipeline;
  pipeline::PipelineTrainer trainer(config, plan.schedule, *transport, groups.data_parallel.get());
  // The rank of the last stage knows the loss: it reports progress in its log, which `run` shows.
  const auto& shape = trainer.schedule().shape;
  const bool reports_progress = groups.replica == 0 && groups.pipeline_rank == shape.RankOfStage(shape.stages() - 1);
  auto own = trainer.Train([&](int64_t step, const pipeline::RankResult& r) {
    if (!reports_progress) return;
    fmt::print("{}step {}/{} loss {:.6g}\n", kProgressPrefix, step + 1, config.train.steps, r.losses.back());
    std::fflush(stdout);
  });
  trainer.RecordPhase(config.train.steps, "results_to_rank_0", rendezvous.rank == 0 ? -1 : 0);
  auto results = pipeline::GatherResults(*transport, std::move(own));
  if (groups.pipeline_rank == 0) results = pipeline::GatherReplicas(*groups.data_parallel, std::move(results));
  trainer.EndPhase();
  // Every rank's share of the checkpoint is written (their results came after it): complete it.
  if (rendezvous.rank == 0) trainer.CommitCheckpoint();
  const int code = rendezvous.rank == 0 ? FinishOnRankZero(plan, config, results, options.out, options.save_tensors) : 0;
  // What this process worked out again that a plan could have handed it: nothing, when it was
  // handed one (rank 0's simulations replay the measured action times, for the step-time prediction).
  fmt::print("{}rank {}: {} suite(s) loaded, {} schedule(s) built, {} validated; {} simulation(s) run\n", kPlanPrefix,
             rendezvous.rank, scenarios::SuitesLoaded(), pipeline::SchedulesBuilt(), pipeline::ValidationsRun(),
             pipeline::SimulationsRun());
  return code;
}

}  // namespace

std::string FlightRecordPath(const std::string& out, int rank) {
  return (std::filesystem::path(out) / fmt::format("rank{}.flight", rank)).string();
}

int RunWorker(const WorkerOptions& options) {
  // A peer that failed closes its sockets; writing to one must be an error this rank reports
  // (EPIPE), not a SIGPIPE that kills it silently before the peer's reason is heard.
  std::signal(SIGPIPE, SIG_IGN);
  reference::StartMemoryMeter();  // before anything is allocated, so every tensor is counted
  // For messages only, until the environment is validated below.
  const char* rank_text = std::getenv("RANK") ? std::getenv("RANK") : std::getenv("SLURM_PROCID");
  std::string rank = rank_text ? rank_text : "?";
  try {
    const Plan plan = WorkerPlan(options);
    if (options.phase.empty()) return RunRank(plan, options, rank);
    rank = options.phase;
    if (options.threads > 0) at::set_num_threads(options.threads);
    return RunExternalPhase(plan, options);
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
