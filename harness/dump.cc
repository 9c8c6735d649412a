// The reference's first step as torch.load-able files (see dump.h).
#include "harness/dump.h"

#include <torch/serialize.h>

#include <filesystem>

#include "harness/scenario_model.h"
#include "reference/trainer.h"
#include "reports/csv.h"

namespace pipecheck::harness {
namespace {

using TensorDict = c10::Dict<std::string, torch::Tensor>;

void SaveDict(const TensorDict& dict, const std::filesystem::path& path) {
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  reports::WriteFileAtomically(path.string(), std::string(bytes.begin(), bytes.end()));
}

TensorDict ToDict(const reference::NamedTensors& tensors) {
  TensorDict dict;
  for (const auto& item : tensors) dict.insert(item.key(), item.value().detach().cpu().contiguous());
  return dict;
}

}  // namespace

void SaveTensors(const reference::NamedTensors& tensors, const std::string& path) { SaveDict(ToDict(tensors), path); }

void SaveBatch(const reference::Batch& batch, const std::string& path) {
  TensorDict dict;
  dict.insert("tokens", batch.tokens);
  dict.insert("labels", batch.labels);
  dict.insert("lengths", batch.lengths);
  SaveDict(dict, path);
}

void DumpReference(const scenarios::Scenario& scenario, const std::string& directory) {
  const std::filesystem::path out(directory);
  std::filesystem::create_directories(out);

  auto config = ToTrainConfig(scenario);
  config.record_gradients = false;
  reference::ReferenceTrainer trainer(config);
  const auto weights = trainer.Weights();
  const auto batch = reference::MakeBatch(config.data, config.seed, /*step=*/0);
  const auto loss = trainer.ForwardBackward(batch);

  TensorDict loss_dict;
  loss_dict.insert("loss", loss.cpu());
  if (trainer.AuxLossSum().defined()) loss_dict.insert("aux_loss", trainer.AuxLossSum().cpu());

  SaveTensors(weights, (out / "weights.pt").string());
  SaveBatch(batch, (out / "batch.pt").string());
  SaveTensors(trainer.Gradients(), (out / "grads.pt").string());
  SaveDict(loss_dict, out / "loss.pt");
  // expert_bias: each MoE layer's bias after the step's update (from zeros, by the batch's counts).
  if (scenario.expert_bias > 0.0) SaveTensors(trainer.MovedExpertBiases(), (out / "bias.pt").string());

  reports::CsvTable table(scenarios::ColumnNames());
  std::vector<std::string> row;
  for (const auto& [column, value] : scenarios::ColumnValues(WithEffectiveValues(scenario))) row.push_back(value);
  table.AddRow(row);
  reports::WriteFileAtomically((out / "scenario.csv").string(), table.ToString());
}

}  // namespace pipecheck::harness
