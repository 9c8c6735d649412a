// Whether a scenario can run here (see runnable.h).
#include "harness/runnable.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include "harness/external.h"
#include "harness/preflight.h"
#include "harness/scenario_model.h"
#include "pipeline/transport.h"
#include "reference/device.h"

namespace pipecheck::harness {

Refusal RefusalHere(const scenarios::Scenario& scenario) {
  if (scenario.device == "cuda" && !torch::cuda::is_available()) {
    return {scenario.source, fmt::format("scenario '{}' needs device cuda, but this build or machine has no CUDA "
                                         "device; run it with --device cpu or on a GPU machine", scenario.name)};
  }
  if (scenario.device == "cuda" && scenario.transport == "nccl" && scenario.world_size > 1 &&
      !pipeline::NcclAvailable()) {
    return {scenario.source, fmt::format("scenario '{}' asks for transport nccl, but this build has none (its LibTorch "
                                         "has no c10d NCCL backend or nccl.h was not found); use staged or auto",
                                         scenario.name)};
  }
  const std::string trainer = TrainerProblem(scenario);
  if (!trainer.empty()) return {scenario.source, fmt::format("scenario '{}': {}", scenario.name, trainer)};
  // The memory model predicts pipecheck's own trainer; another trainer's memory is its own.
  if (scenario.ExternalTrainer()) return {};
  const auto memory = MemoryRefusalOf(scenario);
  return {memory.place, memory.why};
}

std::string UnmetRequirement(const scenarios::Scenario& scenario) {
  const bool framework = scenario.trainer == "torch" || scenario.trainer == "torchtitan" ||
                         scenario.trainer == "deepspeed" || scenario.trainer == "megatron";
  if (framework && scenario.device == "cuda" && scenario.Processes() > 1) {
    // The adapters in trainers/ run their frameworks over NCCL on GPUs, which refuses two ranks on
    // one GPU.
    const int gpus = reference::CudaDeviceCount();
    if (scenario.Processes() <= gpus) return "";
    return fmt::format("trainer {} runs over NCCL on GPUs, a GPU per rank: {} ranks, {} GPU{}", scenario.trainer,
                       scenario.Processes(), gpus, gpus == 1 ? "" : "s");
  }
  if (scenario.ExternalTrainer() || ResolveTransport(scenario) != "nccl") return "";
  const int64_t ranks = RanksOnThisHost(scenario);
  const int gpus = reference::CudaDeviceCount();
  if (ranks <= gpus) return "";
  return fmt::format("transport nccl needs a GPU per rank: {} ranks on this host, {} GPU{} (NCCL refuses two ranks on "
                     "one GPU; transport staged or auto runs them sharing)",
                     ranks, gpus, gpus == 1 ? "" : "s");
}

}  // namespace pipecheck::harness
