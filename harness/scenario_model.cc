// Scenario -> trainer configuration (see scenario_model.h).
#include "harness/scenario_model.h"

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdlib>
#include <stdexcept>

#include "harness/preflight.h"
#include "pipeline/lowering.h"
#include "pipeline/schedule_csv.h"
#include "reference/device.h"
#include "reference/dtype_name.h"
#include "scenarios/dtypes.h"

namespace pipecheck::harness {

namespace {

// Simulating a schedule costs about 35 us a compute action (0.3 s for 8192 on a 2-core Debian 12
// machine), so this keeps validating any row under a second; a shape past it is left to the
// workers, which validate their schedule before they run it.
constexpr int64_t kMaxActionsCheckedAtLoad = 8192;

std::string ScheduleProblem(const scenarios::Scenario& scenario, pipeline::CommunicationModel model) {
  if (scenario.world_size * scenario.virtual_stages * scenario.microbatches > kMaxActionsCheckedAtLoad) return "";
  const pipeline::PipelineShape shape{static_cast<int>(scenario.world_size), static_cast<int>(scenario.virtual_stages),
                                      static_cast<int>(scenario.microbatches)};
  try {
    const auto lowered = pipeline::LowerScheduleWithin(pipeline::ScheduleByName(scenario.schedule, shape), kLoweringBudget);
    if (!lowered) return "";  // a long search for where to post receives: the workers do it
    pipeline::ValidateSchedule(*lowered, {}, model);
  } catch (const pipeline::ScheduleError& error) {
    return error.what();
  }
  return "";
}

// At load, a scenario that names nccl is checked on device streams; auto is resolved per host
// when it runs (ResolveTransport).
std::string LoadedScheduleProblem(const scenarios::Scenario& scenario) {
  return ScheduleProblem(scenario, scenario.transport == "nccl" && scenario.device == "cuda"
                                       ? pipeline::CommunicationModel::kDeviceStreams
                                       : pipeline::CommunicationModel::kHost);
}

}  // namespace

const scenarios::Vocabulary& PipelineVocabulary() {
  static const scenarios::Vocabulary vocabulary = [] {
    scenarios::Vocabulary v;
    v.schedules = pipeline::ScheduleNames();
    for (const auto& info : pipeline::ScheduleRegistry()) {
      v.schedule_rules.push_back(
          {info.name, info.several_stages_per_rank, info.fixed_virtual_stages, info.default_virtual_stages});
    }
    v.faults = pipeline::FaultNames();
    v.schedule_problem = LoadedScheduleProblem;
    v.torch_version = {TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR};
    return v;
  }();
  return vocabulary;
}

std::vector<scenarios::Scenario> LoadSuite(const std::string& path, const std::string& device) {
  if (device.empty()) return scenarios::LoadScenarios(path, PipelineVocabulary());
  scenarios::Vocabulary on_device = PipelineVocabulary();
  on_device.device = device;
  return scenarios::LoadScenarios(path, on_device);
}

std::vector<scenarios::Scenario> ParseSuite(const std::string& text, const std::string& display_name) {
  return scenarios::ParseScenarios(text, display_name, PipelineVocabulary());
}

torch::Dtype ParseDtype(const std::string& dtype) {
  const auto& traits = scenarios::DtypeOf(dtype);  // std::invalid_argument for an unknown name
  for (const torch::Dtype candidate : {torch::kFloat64, torch::kFloat32, torch::kBFloat16}) {
    if (reference::DtypeName(candidate) == traits.name) return candidate;
  }
  throw std::logic_error("dtype '" + dtype + "' has no LibTorch dtype here");
}

torch::Device ScenarioDevice(const scenarios::Scenario& scenario) {
  if (scenario.device == "cuda") {
    TORCH_CHECK(torch::cuda::is_available(), "scenario ", scenario.name, " (", scenario.source,
                ") asks for device cuda, but this build or machine has no CUDA device");
    return torch::Device(torch::kCUDA, 0);
  }
  return torch::kCPU;
}

namespace {

// An integer environment variable (torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE), or `fallback` when unset.
int64_t EnvironmentIntegerOr(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    throw std::invalid_argument(fmt::format("{}='{}' is not a number", name, text));
  }
}

}  // namespace

torch::Device CudaDeviceOfThisRank() {
  const int64_t local = EnvironmentIntegerOr("LOCAL_RANK", 0);
  TORCH_CHECK(local >= 0, "LOCAL_RANK=", local, " is negative");
  const int count = reference::CudaDeviceCount();
  TORCH_CHECK(count > 0, "device cuda asked for, but no CUDA device is visible");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local % count));
}

reference::ModelConfig ToModelConfig(const scenarios::Scenario& scenario) {
  reference::ModelConfig model;
  model.flavor = scenario.flavor == "gpt2" ? reference::Flavor::kGpt2 : reference::Flavor::kLlama;
  model.layers = scenario.layers;
  model.hidden = scenario.hidden;
  model.heads = scenario.heads;
  model.kv_heads = scenario.kv_heads;
  model.ffn = scenario.ffn;
  model.experts = scenario.experts;
  model.top_k = scenario.top_k;
  model.dense_layers = scenario.dense_layers;
  model.shared_experts = scenario.shared_experts;
  model.expert_ffn = scenario.expert_ffn;
  model.router = scenario.router == "sigmoid" ? reference::Router::kSigmoid : reference::Router::kSoftmax;
  model.aux_loss = scenario.aux_loss;
  model.expert_bias = scenario.expert_bias;
  model.vocab = scenario.vocab;
  model.max_seq_len = scenario.seq_len;
  model.tied = scenario.tied;
  return model;
}

int64_t RanksOnThisHost(const scenarios::Scenario& scenario) {
  return EnvironmentIntegerOr("LOCAL_WORLD_SIZE", scenario.Processes());
}

std::string ResolveTransport(const scenarios::Scenario& scenario) {
  if (scenario.world_size == 1) return "none";
  if (scenario.device == "cpu") return "gloo";
  if (scenario.transport != "auto") return scenario.transport;
  const bool gpu_per_rank = RanksOnThisHost(scenario) <= reference::CudaDeviceCount();
  // nccl also needs a schedule that runs on device streams (simulator.h: kDeviceStreams); auto
  // takes staged for the others, and the summary's transport column says so.
  return gpu_per_rank && pipeline::NcclAvailable() &&
                 ScheduleProblem(scenario, pipeline::CommunicationModel::kDeviceStreams).empty()
             ? "nccl"
             : "staged";
}

reference::TrainConfig ToTrainConfig(const scenarios::Scenario& scenario) {
  reference::TrainConfig config;
  config.model = ToModelConfig(scenario);
  config.data.batch = scenario.batch;
  config.data.seq_len = scenario.seq_len;
  config.data.seq_len_min = scenario.seq_len_min;
  config.data.vocab = scenario.vocab;
  config.optimizer.kind =
      scenario.optimizer == "sgd" ? reference::OptimizerKind::kSgd : reference::OptimizerKind::kAdamW;
  config.optimizer.lr = scenario.lr;
  config.seed = scenario.seed;
  config.steps = scenario.steps;
  config.clip = scenario.clip;
  config.loss_microbatches = scenario.loss == "microbatch_mean" ? scenario.StepMicrobatches() : 0;
  config.dtype = ParseDtype(scenario.dtype);
  config.device = ScenarioDevice(scenario);
  return config;
}

pipeline::PipelineConfig ExternalTrainerView(const scenarios::Scenario& scenario) {
  auto view = scenario;
  view.fault = "none";
  return ToPipelineConfig(view, "");
}

pipeline::PipelineConfig ToPipelineConfig(const scenarios::Scenario& scenario) {
  return ToPipelineConfig(scenario, ResolveTransport(scenario));
}

pipeline::PipelineConfig ToPipelineConfig(const scenarios::Scenario& scenario, const std::string& transport) {
  pipeline::PipelineConfig config;
  config.train = ToTrainConfig(scenario);
  config.world_size = static_cast<int>(scenario.world_size);
  config.virtual_stages = static_cast<int>(scenario.virtual_stages);
  config.microbatches = static_cast<int>(scenario.microbatches * scenario.accumulation);  // every round's
  config.accumulation = static_cast<int>(scenario.accumulation);
  config.schedule = scenario.schedule;
  config.partition = scenario.partition;
  config.fault = pipeline::ParseFault(scenario.fault);
  config.data_parallel = static_cast<int>(scenario.data_parallel);
  config.recompute = scenario.recompute;
  config.communication =
      transport == "nccl" ? pipeline::CommunicationModel::kDeviceStreams : pipeline::CommunicationModel::kHost;
  return config;
}

scenarios::Scenario WithEffectiveValues(scenarios::Scenario scenario) {
  scenario.ffn = ToModelConfig(scenario).FfnSize();
  return scenario;
}

}  // namespace pipecheck::harness
