// From a scenario row to the trainers' configuration: the one place where CSV strings become
// model, data and optimiser settings, so the reference and the pipeline read them alike.
#pragma once

#include "pipeline/trainer.h"
#include "reference/trainer.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// The schedule and fault names the pipeline implements, for the scenario loader.
const scenarios::Vocabulary& PipelineVocabulary();

// A suite loaded (from a file) or parsed (from text) against PipelineVocabulary(); with
// `device`, every row on that device (`--device`), checked as such.
std::vector<scenarios::Scenario> LoadSuite(const std::string& path, const std::string& device = "");
std::vector<scenarios::Scenario> ParseSuite(const std::string& text, const std::string& display_name);

torch::Dtype ParseDtype(const std::string& dtype);

// The device a scenario asks for; throws when it is not available in this process.
torch::Device ScenarioDevice(const scenarios::Scenario& scenario);

// torchrun's contract: a rank uses cuda:LOCAL_RANK (0 without it); ranks beyond the host's GPUs
// share them (cuda:LOCAL_RANK modulo the count). Throws when no CUDA device is visible.
torch::Device CudaDeviceOfThisRank();

reference::ModelConfig ToModelConfig(const scenarios::Scenario& scenario);
reference::TrainConfig ToTrainConfig(const scenarios::Scenario& scenario);

// The transport a scenario's ranks use: "none" at world size 1 (no communication), "gloo" on
// cpu; on cuda the scenario's choice, where auto is nccl when every rank of this host has its
// own GPU (and the build has the nccl transport) and staged otherwise. The ranks of a run are
// on this host; under torchrun, LOCAL_WORLD_SIZE says how many share it.
std::string ResolveTransport(const scenarios::Scenario& scenario);

// Ranks of this run on this host: torchrun's LOCAL_WORLD_SIZE, else all of them (`run`).
int64_t RanksOnThisHost(const scenarios::Scenario& scenario);

// Another trainer's scenario as pipecheck's pipeline configuration sees it: its stages' places
// and layers, the reference's training configuration and the schedule's shape. The fault is the
// other trainer's to inject (none here), and its communication its own (the host model here,
// never used to run it).
pipeline::PipelineConfig ExternalTrainerView(const scenarios::Scenario& scenario);

pipeline::PipelineConfig ToPipelineConfig(const scenarios::Scenario& scenario);
// The same for ranks connected over `transport` (ResolveTransport's names; "nccl" runs on device
// streams, any other on the host).
pipeline::PipelineConfig ToPipelineConfig(const scenarios::Scenario& scenario, const std::string& transport);

// The scenario with every default made explicit (ffn resolved from the flavour).
scenarios::Scenario WithEffectiveValues(scenarios::Scenario scenario);

}  // namespace pipecheck::harness
