// Another trainer under test, through the external-trainer protocol (see external.h).
#include "harness/external.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "harness/boundaries.h"
#include "harness/dump.h"
#include "harness/errors.h"
#include "harness/oracle.h"
#include "harness/parity.h"
#include "harness/run_directory.h"
#include "harness/scenario_model.h"
#include "pipeline/rank_result.h"
#include "pipeline/schedule_name.h"
#include "pipeline/stage.h"
#include "reference/data.h"
#include "reference/fingerprint.h"
#include "reference/optimizer.h"
#include "reports/csv.h"
#include "scenarios/dtypes.h"

#ifndef PIPECHECK_SOURCE_DIR
#error "PIPECHECK_SOURCE_DIR must name the source tree (trainers/ lives there)"
#endif
#ifndef PIPECHECK_PYTHON_DEFAULT
#define PIPECHECK_PYTHON_DEFAULT "python3"
#endif
#ifndef PIPECHECK_METER_LIBRARY
#define PIPECHECK_METER_LIBRARY ""
#endif

namespace pipecheck::harness {
namespace {

namespace fs = std::filesystem;
using reference::NamedTensors;

nlohmann::json ConfigJson(const scenarios::Scenario& scenario, const pipeline::PipelineShape& shape,
                          const std::vector<reference::Batch>& batches, const NamedTensors& weights,
                          const Segment& segment) {
  const auto effective = WithEffectiveValues(scenario);
  nlohmann::json config;
  config["protocol"] = 1;
  for (const auto& [column, value] : scenarios::ColumnValues(effective)) config["scenario"][column] = value;
  config["name"] = scenario.name;
  config["schedule"] = scenario.schedule_written.empty() ? scenario.schedule : scenario.schedule_written;
  if (const auto path = pipeline::ScheduleCsvPath(scenario.schedule)) {
    config["schedule_csv"] = fs::absolute(*path).string();
  }
  config["world_size"] = scenario.world_size;
  config["virtual_stages"] = scenario.virtual_stages;
  config["steps"] = scenario.steps;
  if (segment.count > 1) {
    // A stretch of a resumed run: train steps first_step .. steps - 1, after loading the trainer's
    // own checkpoint from "load" (none for the first), and write it into "save" after the last
    // (none for the last stretch).
    config["resume"] = {{"first_step", segment.first_step},
                        {"load", segment.load_checkpoint.empty() ? "" : fs::absolute(segment.load_checkpoint).string()},
                        {"save", segment.save_checkpoint.empty() ? "" : fs::absolute(segment.save_checkpoint).string()}};
  }
  config["microbatches"] = scenario.microbatches;
  // The step's microbatches in order: replica by replica, each replica's accumulation rounds one
  // after another, each round `microbatches` of them (docs/protocol.md).
  config["data_parallel"] = scenario.data_parallel;
  config["accumulation"] = scenario.accumulation;
  config["microbatch_sizes"] = reference::MicrobatchSizes(scenario.batch, scenario.StepMicrobatches());
  config["dtype"] = scenario.dtype;
  config["device"] = scenario.device;
  config["clip"] = scenario.clip;
  config["seed"] = scenario.seed;
  config["fault"] = scenario.fault;
  config["model"] = {{"flavor", effective.flavor}, {"layers", effective.layers}, {"hidden", effective.hidden},
                     {"heads", effective.heads},   {"ffn", effective.ffn},       {"vocab", effective.vocab},
                     {"tied", effective.tied},     {"seq_len", effective.seq_len},
                     {"kv_heads", effective.kv_heads > 0 ? effective.kv_heads : effective.heads}};
  if (scenario.experts > 0) {
    // The mixture of experts (docs/protocol.md "model.moe"): layers dense_layers on route each
    // token to top_k of `experts` llama MLPs of expert_ffn; aux_loss is the sequence-wise balance
    // loss's weight; each sequence's term is divided by sequences_per_step, the step's whole batch.
    const auto model = ToModelConfig(scenario);
    config["model"]["moe"] = {{"experts", scenario.experts},
                              {"top_k", scenario.top_k},
                              {"dense_layers", scenario.dense_layers},
                              {"shared_experts", scenario.shared_experts},
                              {"expert_ffn", model.ExpertFfnSize()},
                              {"router", scenario.router},
                              {"aux_loss", scenario.aux_loss},
                              {"expert_bias", scenario.expert_bias},
                              {"sequences_per_step", scenario.batch}};
  }
  config["optimizer"] = {{"name", scenario.optimizer}, {"lr", scenario.lr}};
  if (scenario.optimizer == "adamw") {
    config["optimizer"]["betas"] = {reference::kAdamBeta1, reference::kAdamBeta2};
    config["optimizer"]["eps"] = reference::kAdamEps;
    config["optimizer"]["weight_decay"] = reference::kAdamWeightDecay;
  }
  const auto view = ExternalTrainerView(scenario);
  const auto slices = pipeline::StageSlicesOf(view, shape);
  for (int stage = 0; stage < shape.stages(); ++stage) {
    const auto& slice = slices[static_cast<size_t>(stage)];
    config["stages"].push_back({{"stage", stage},
                                {"rank", shape.RankOfStage(stage)},
                                {"layers", {slice.first_layer, slice.end_layer}},
                                {"embedding", slice.has_embedding},
                                {"head", slice.has_head}});
  }
  for (const auto& item : weights) config["parameters"][item.key()] = item.value().sizes().vec();
  // loss: "tokens" or "microbatch_mean" (loss_rule says it in words).
  config["loss"] = scenario.loss;
  config["loss_rule"] = scenario.loss == "tokens"
                            ? "the summed token cross entropy of the batch divided by its labelled tokens"
                            : "each microbatch's summed token cross entropy divided by its own labelled tokens, averaged "
                              "over the step's microbatches (every replica's and round's)";
  for (const auto& batch : batches) config["tokens_per_step"].push_back(batch.valid_tokens);
  return config;
}

// ---- Reading what a trainer handed back ----

// A breach of the protocol: the message names rank, step and file.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

c10::impl::GenericDict ReadDict(const fs::path& path, const std::string& what) {
  std::error_code error;
  if (!fs::exists(path, error)) throw ProtocolError(fmt::format("{} handed back no {}", what, path.filename().string()));
  const auto size = fs::file_size(path, error);
  if (error || static_cast<int64_t>(size) > kMaxExchangeFileBytes) {
    throw ProtocolError(fmt::format("{}: {} is not a readable file under {} GiB", what, path.string(),
                                    kMaxExchangeFileBytes >> 30));
  }
  std::ifstream stream(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw ProtocolError(fmt::format("{}: {} is not a torch.save'd dict: {}", what, path.filename().string(),
                                    FirstLine(ErrorMessage(e))));
  }
  if (!value.isGenericDict()) {
    throw ProtocolError(fmt::format("{}: {} holds a {}, not a dict", what, path.filename().string(),
                                    value.tagKind()));
  }
  return value.toGenericDict();
}

// A {name: tensor} dict of the model's parameters: known names, the model's shapes, finite values;
// converted to the reference's dtype on the CPU. `initial`: the model's initial weights, which
// give every name, shape and that dtype.
NamedTensors ReadTensors(const c10::IValue& value, const NamedTensors& initial, const std::string& what) {
  if (!value.isGenericDict()) throw ProtocolError(fmt::format("{}: expected a dict of name -> tensor, got a {}", what, value.tagKind()));
  NamedTensors tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) throw ProtocolError(fmt::format("{}: a key is a {}, not a parameter name", what, entry.key().tagKind()));
    const std::string name = entry.key().toStringRef();
    if (!initial.contains(name)) {
      throw ProtocolError(fmt::format("{}: '{}' is no parameter of the model (names are pipecheck's global names, as in "
                                      "config.json's \"parameters\")", what, name));
    }
    if (!entry.value().isTensor()) throw ProtocolError(fmt::format("{}: {} is a {}, not a tensor", what, name, entry.value().tagKind()));
    const auto& expected = initial[name];
    const auto tensor = entry.value().toTensor();
    if (tensor.sizes() != expected.sizes()) {
      throw ProtocolError(fmt::format("{}: {} has shape [{}], the model's is [{}]", what, name,
                                      fmt::join(tensor.sizes(), ", "), fmt::join(expected.sizes(), ", ")));
    }
    if (!tensor.is_floating_point()) throw ProtocolError(fmt::format("{}: {} is {}, not floating point", what, name, tensor.dtype().name()));
    const auto converted = tensor.detach().to(torch::kCPU, expected.scalar_type()).contiguous();
    if (!torch::isfinite(converted).all().item<bool>()) {
      const bool nan = torch::isnan(converted).any().item<bool>();
      throw ProtocolError(fmt::format("{}: {} holds {}", what, name, nan ? "NaN" : "an infinite value"));
    }
    if (tensors.contains(name)) throw ProtocolError(fmt::format("{}: {} twice", what, name));
    tensors.insert(name, converted);
  }
  return tensors;
}

c10::IValue Entry(const c10::impl::GenericDict& dict, const std::string& key) {
  const auto found = dict.find(c10::IValue(key));
  return found == dict.end() ? c10::IValue() : found->value();
}

// An optional 0-dim number of a step's record.
std::optional<double> Scalar(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what) {
  const auto value = Entry(dict, key);
  if (value.isNone()) return std::nullopt;
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  if (!value.isTensor() || value.toTensor().numel() != 1) {
    throw ProtocolError(fmt::format("{}: \"{}\" must be a number or a one-element tensor", what, key));
  }
  const double number = value.toTensor().to(torch::kFloat64).item<double>();
  if (!std::isfinite(number)) throw ProtocolError(fmt::format("{}: \"{}\" is {}", what, key, number));
  return number;
}

// A step's "actions_ms" (optional): milliseconds by kind of work, each kind one the protocol names.
std::map<std::string, double> ReadActionsMs(const c10::IValue& value, const std::string& what) {
  std::map<std::string, double> actions;
  if (value.isNone()) return actions;
  if (!value.isGenericDict()) throw ProtocolError(fmt::format("{}: \"actions_ms\" is a {}, not a dict", what, value.tagKind()));
  static const std::set<std::string> kKinds = {"F", "B", "I", "W", "COMM", "WAIT"};
  c10::impl::GenericDict dict = value.toGenericDict();
  for (const auto& entry : dict) {
    const std::string kind = entry.key().isString() ? entry.key().toStringRef() : std::string();
    if (kKinds.count(kind) == 0) {
      throw ProtocolError(fmt::format("{}: \"actions_ms\" has a kind {} (F, B, I, W, COMM or WAIT)", what,
                                      entry.key().isString() ? kind : entry.key().tagKind()));
    }
    const auto ms = Scalar(dict, kind, what + " actions_ms");
    if (*ms < 0.0) throw ProtocolError(fmt::format("{}: \"actions_ms\" gives {} {} ms", what, kind, *ms));
    actions[kind] = *ms;
  }
  return actions;
}

// Every step's microbatch cuts: what its boundary tensors must look like.
std::vector<std::vector<MicrobatchCut>> MicrobatchCuts(const scenarios::Scenario& scenario,
                                                       const reference::TrainConfig& train) {
  std::vector<std::vector<MicrobatchCut>> steps;
  for (int64_t step = 0; step < scenario.steps; ++step) {
    steps.push_back(CutMicrobatches(reference::MakeBatch(train.data, train.seed, step), scenario.microbatches));
  }
  return steps;
}

// The optional "boundaries" of a step's record: {"activation/S/M": the hidden state entering stage
// S for microbatch M, "gradient/S/M": the gradient of stage S's output}, each (the microbatch's
// sequences, its longest length, hidden), fingerprinted as pipecheck's own ranks do. The rank that
// hands one back saw it arrive (its stage takes it), leave (its stage made it) or both.
std::vector<pipeline::BoundaryRecord> ReadBoundaries(const c10::IValue& value, int rank, int64_t step,
                                                     const pipeline::PipelineShape& shape,
                                                     const std::vector<MicrobatchCut>& microbatches, int64_t hidden,
                                                     const std::string& what) {
  std::vector<pipeline::BoundaryRecord> records;
  if (value.isNone()) return records;
  if (!value.isGenericDict()) throw ProtocolError(fmt::format("{}: \"boundaries\" must be a dict", what));
  const int stages = shape.stages();
  for (const auto& entry : value.toGenericDict()) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : "";
    char kind[16] = {0};
    int stage = -1, microbatch = -1, used = 0;
    const bool parsed = std::sscanf(key.c_str(), "%15[a-z]/%d/%d%n", kind, &stage, &microbatch, &used) == 3 &&
                        used == static_cast<int>(key.size());
    const std::string direction = kind;
    const bool activation = direction == "activation";
    if (!parsed || (!activation && direction != "gradient")) {
      throw ProtocolError(fmt::format("{}: boundary '{}' is not activation/STAGE/MICROBATCH or gradient/STAGE/MICROBATCH",
                                      what, key));
    }
    const bool stage_ok = activation ? stage >= 1 && stage < stages : stage >= 0 && stage + 1 < stages;
    if (!stage_ok || microbatch < 0 || microbatch >= static_cast<int>(microbatches.size())) {
      throw ProtocolError(fmt::format("{}: boundary '{}' names no boundary of {} stages and {} microbatches", what, key,
                                      stages, microbatches.size()));
    }
    // The stage that takes the tensor, and the one that makes it.
    const int taker = stage, maker = activation ? stage - 1 : stage + 1;
    const int taker_rank = shape.RankOfStage(taker), maker_rank = shape.RankOfStage(maker);
    if (rank != taker_rank && rank != maker_rank) {
      throw ProtocolError(fmt::format("{}: boundary '{}' passes between ranks {} and {}, not this one", what, key,
                                      maker_rank, taker_rank));
    }
    if (!entry.value().isTensor()) throw ProtocolError(fmt::format("{}: boundary '{}' is not a tensor", what, key));
    const auto tensor = entry.value().toTensor().detach().to(torch::kCPU);
    const auto& expected = microbatches[static_cast<size_t>(microbatch)];
    if (tensor.dim() != 3 || tensor.size(0) != expected.size || tensor.size(1) != expected.time || tensor.size(2) != hidden) {
      throw ProtocolError(fmt::format("{}: boundary '{}' has shape [{}], expected [{}, {}, {}] (the microbatch's "
                                      "sequences, its longest length, hidden)", what, key,
                                      fmt::join(tensor.sizes(), ", "), expected.size, expected.time, hidden));
    }
    pipeline::BoundaryRecord record;
    record.step = step;
    record.microbatch = microbatch;
    record.stage = stage;
    record.direction = activation ? pipeline::Direction::kActivation : pipeline::Direction::kGradient;
    record.role = taker_rank == maker_rank ? pipeline::BoundaryRole::kHandedOver
                  : rank == taker_rank    ? pipeline::BoundaryRole::kReceived
                                          : pipeline::BoundaryRole::kSent;
    record.peer = taker_rank == maker_rank ? -1 : (rank == taker_rank ? maker_rank : taker_rank);
    record.fingerprint = reference::FingerprintOf(tensor.contiguous());
    records.push_back(record);
  }
  return records;
}

// Rank `rank`'s start weights and every step's record, as the judges read a rank of pipecheck's own.
// expert_bias: a step's "expert_counts", {layers.{i}.feed_forward.expert_counts: (E) counts},
// one per MoE layer whose bias the rank moved (`biases`, the names it handed back).
NamedTensors ReadExpertCounts(const c10::IValue& value, const NamedTensors& biases, const std::string& what) {
  NamedTensors counts;
  if (value.isNone()) {
    if (!biases.is_empty()) throw ProtocolError(fmt::format("{}: \"expert_biases\" without \"expert_counts\"", what));
    return counts;
  }
  if (!value.isGenericDict()) throw ProtocolError(fmt::format("{}: \"expert_counts\" is a {}, not a dict", what, value.tagKind()));
  for (const auto& entry : value.toGenericDict()) {
    const std::string name = entry.key().isString() ? entry.key().toStringRef() : std::string();
    const int64_t layer = reference::LayerOfName(name);
    const std::string bias = fmt::format("layers.{}.feed_forward.expert_bias", layer);
    if (name != pipeline::ExpertCountsName(layer) || !biases.contains(bias)) {
      throw ProtocolError(fmt::format("{}: expert_counts '{}' names no MoE layer whose bias the rank handed back (keys "
                                      "are layers.{{i}}.feed_forward.expert_counts)", what, name));
    }
    const auto tensor = entry.value().isTensor() ? entry.value().toTensor().detach().cpu() : torch::Tensor();
    if (!tensor.defined() || tensor.dim() != 1 || tensor.size(0) != biases[bias].size(0) ||
        !torch::equal(tensor.to(torch::kFloat64), tensor.to(torch::kFloat64).round())) {
      throw ProtocolError(fmt::format("{}: expert_counts '{}' must be a tensor of {} whole counts", what, name,
                                      biases[bias].size(0)));
    }
    counts.insert(name, tensor.to(torch::kInt64));
  }
  return counts;
}

pipeline::RankResult ReadRank(const fs::path& folder, int rank, const scenarios::Scenario& scenario,
                              const pipeline::PipelineShape& shape, const NamedTensors& initial,
                              const NamedTensors& initial_biases,
                              const std::vector<std::vector<MicrobatchCut>>& microbatches, int64_t first_step) {
  pipeline::RankResult result;
  result.rank = rank;
  // A resumed stretch: placeholders for the steps before it, start.pt being what the rank loaded.
  const auto unset = static_cast<size_t>(first_step);
  result.first_step = first_step;
  result.weights.resize(unset);
  result.gradients.resize(unset);
  result.losses.assign(unset, std::nan(""));
  result.aux_losses.assign(unset, std::nan(""));
  result.step_ms.assign(unset, std::nan(""));
  result.peak_bytes.assign(unset, -1);
  if (scenario.expert_bias > 0.0) result.expert_counts.resize(unset), result.expert_biases.resize(unset);
  for (int stage = 0; stage < shape.stages(); ++stage) {
    if (shape.RankOfStage(stage) == rank) result.stages.push_back(stage);
  }
  const std::string who = fmt::format("rank {}", rank);
  const auto start = ReadDict(folder / "start.pt", who);
  result.weights.push_back(ReadTensors(c10::IValue(start), initial, fmt::format("rank {} start.pt", rank)));
  if (first_step > 0) {
    for (const auto& item : result.weights.back()) result.loaded.insert("weight/" + item.key(), item.value());
  }
  NamedTensors initial_float32;  // what master weights are read against: made at the first
  const auto float32_initial = [&]() -> const NamedTensors& {
    if (initial_float32.is_empty()) {
      for (const auto& item : initial) initial_float32.insert(item.key(), item.value().to(torch::kFloat32));
    }
    return initial_float32;
  };
  for (int64_t step = first_step; step < scenario.steps; ++step) {
    const std::string file = fmt::format("step_{}.pt", step);
    const std::string what = fmt::format("rank {} {}", rank, file);
    const auto record = ReadDict(folder / file, who);
    for (const char* key : {"grads", "weights"}) {
      if (Entry(record, key).isNone()) throw ProtocolError(fmt::format("{}: no \"{}\" (the protocol asks for it every step)", what, key));
    }
    // Master weights: every step or none, and only beside lower-precision parameters. A trainer
    // that keeps them applies float32 gradients, which are read as they are.
    const auto master = Entry(record, "master_weights");
    result.gradients.push_back(ReadTensors(Entry(record, "grads"), master.isNone() ? initial : float32_initial(),
                                           what + " grads"));
    auto after = ReadTensors(Entry(record, "weights"), initial, what + " weights");
    if (master.isNone() != (result.master_weights.size() <= unset) && step > first_step) {
      throw ProtocolError(fmt::format("{}: \"master_weights\" {} while step 0's record {} them (every step or none)", what,
                                      master.isNone() ? "missing" : "given", master.isNone() ? "gave" : "did not give"));
    }
    if (!master.isNone()) {
      if (!scenarios::DtypeOf(scenario.dtype).reduced) {
        throw ProtocolError(fmt::format("{}: \"master_weights\" are for lower-precision parameters, but the scenario's "
                                        "dtype is {}", what, scenario.dtype));
      }
      if (result.master_weights.size() < unset) result.master_weights.resize(unset);
      result.master_weights.push_back(ReadTensors(master, float32_initial(), what + " master_weights"));
    }
    const auto loss = Scalar(record, "loss", what);
    result.losses.push_back(loss.value_or(std::nan("")));
    // The balance loss's part of "loss" (a mixture of experts), from the rank that reports the loss.
    const auto aux = Scalar(record, "aux_loss", what);
    if (aux && !loss) {
      throw ProtocolError(fmt::format("{}: \"aux_loss\" without \"loss\" (the rank that reports the step's loss "
                                      "reports its balance-loss part)", what));
    }
    result.aux_losses.push_back(aux.value_or(std::nan("")));
    const auto ms = Scalar(record, "step_ms", what);
    result.step_ms.push_back(ms.value_or(std::nan("")));
    const auto peak = Scalar(record, "peak_bytes", what);
    result.peak_bytes.push_back(peak ? static_cast<int64_t>(*peak) : -1);
    if (result.actions_ms.size() < unset) result.actions_ms.resize(unset);
    result.actions_ms.push_back(ReadActionsMs(Entry(record, "actions_ms"), what));
    auto boundaries = ReadBoundaries(Entry(record, "boundaries"), rank, step, shape,
                                     microbatches[static_cast<size_t>(step)], scenario.hidden, what);
    result.boundaries.insert(result.boundaries.end(), boundaries.begin(), boundaries.end());
    if (step + 1 < scenario.steps) {
      result.weights.push_back(std::move(after));
    } else {
      result.final_weights = std::move(after);
    }
    if (scenario.expert_bias > 0.0) {
      // The biases after the step's update (a rank without MoE layers hands back none), and the
      // routing counts that moved them. Each starts at the reference's zeros.
      const auto given = Entry(record, "expert_biases");
      auto biases = given.isNone() ? NamedTensors() : ReadTensors(given, initial_biases, what + " expert_biases");
      result.expert_counts.push_back(ReadExpertCounts(Entry(record, "expert_counts"), biases, what));
      if (step == 0) {
        NamedTensors start;
        for (const auto& item : biases) start.insert(item.key(), initial_biases[item.key()]);
        result.expert_biases.push_back(std::move(start));
      } else if (step == first_step) {
        // A resumed stretch starts from biases it does not hand back: the judge holds the moved
        // ones against the reference from the next step on; this step's starting ones are the
        // previous stretch's last.
        result.expert_biases.push_back(NamedTensors());
      }
      if (step + 1 < scenario.steps) {
        result.expert_biases.push_back(std::move(biases));
      } else {
        result.final_expert_biases = std::move(biases);
      }
    }
  }
  return result;
}

// Every step's loss came back from some rank, and step times from all ranks or none.
void CheckCompleteness(const std::vector<pipeline::RankResult>& ranks, int64_t steps) {
  const int64_t first = ranks.empty() ? 0 : ranks.front().first_step;
  for (int64_t step = first; step < steps; ++step) {
    const bool has_loss = std::any_of(ranks.begin(), ranks.end(), [&](const pipeline::RankResult& r) {
      return !std::isnan(r.losses[static_cast<size_t>(step)]);
    });
    if (!has_loss) {
      throw ProtocolError(fmt::format("no rank handed back step {}'s loss (\"loss\" in step_{}.pt of the rank that "
                                      "computes it)", step, step));
    }
  }
  const auto timed_all = [&](const pipeline::RankResult& r) {
    return std::none_of(r.step_ms.begin() + std::min<int64_t>(first, static_cast<int64_t>(r.step_ms.size())),
                        r.step_ms.end(), [](double ms) { return std::isnan(ms); });
  };
  const bool any_timed = std::any_of(ranks.begin(), ranks.end(), timed_all);
  for (auto& rank : ranks) {
    const bool timed = timed_all(rank);
    if (any_timed && !timed) {
      throw ProtocolError(fmt::format("rank {} left out \"step_ms\" in some step while other ranks timed every step", rank.rank));
    }
  }
}

// The lines a command printed, for a refusal's message.
std::string RunForOutput(const std::string& command, int& status) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    status = -1;
    return "cannot start a shell";
  }
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  status = pclose(pipe);
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  const size_t last = output.rfind('\n');
  return last == std::string::npos ? output : output.substr(last + 1);
}

std::string Quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string ExchangeInputs(const std::string& directory) { return (fs::path(directory) / "exchange" / "in").string(); }
std::string ExchangeOutputs(const std::string& directory) { return (fs::path(directory) / "exchange" / "out").string(); }

void PrepareExchange(const scenarios::Scenario& scenario, const pipeline::PipelineShape& shape,
                     const std::string& directory, const Segment& segment) {
  const fs::path in = ExchangeInputs(directory);
  RemoveTree(fs::path(directory) / "exchange");
  fs::create_directories(in);
  fs::create_directories(ExchangeOutputs(directory));
  auto train = ToTrainConfig(scenario);
  train.device = torch::kCPU;  // the files are the same for every device
  train.record_gradients = false;
  const auto weights = reference::ReferenceTrainer(train).Weights();
  SaveTensors(weights, (in / "weights.pt").string());
  std::vector<reference::Batch> batches;
  for (int64_t step = 0; step < scenario.steps; ++step) {
    batches.push_back(reference::MakeBatch(train.data, train.seed, step));
    SaveBatch(batches.back(), (in / fmt::format("batch_{}.pt", step)).string());
  }
  reports::WriteFileAtomically((in / "config.json").string(), ConfigJson(scenario, shape, batches, weights, segment).dump(2) + "\n");
}

reports::ScenarioReport JudgeExchange(const scenarios::Scenario& scenario, const pipeline::PipelineShape& shape,
                                      const std::string& directory, const Segment& segment) {
  const auto view = ExternalTrainerView(scenario);
  // The reference taps the stage boundaries, as for pipecheck's own ranks; they are judged where
  // the trainer handed some back.
  auto train = view.train;
  train.boundary_layers = BoundaryLayers(pipeline::StageSlicesOf(view, shape));
  Oracle oracle(train, scenario.StepMicrobatches());
  const auto microbatches = MicrobatchCuts(scenario, train);
  std::vector<pipeline::RankResult> ranks;
  try {
    // Process P holds pipeline rank P % world_size of replica P / world_size.
    for (int process = 0; process < scenario.Processes(); ++process) {
      const int rank = process % static_cast<int>(scenario.world_size);
      auto result = ReadRank(fs::path(ExchangeOutputs(directory)) / fmt::format("rank{}", process), rank, scenario,
                             shape, oracle.InitialWeights(), oracle.InitialExpertBiases(), microbatches,
                             segment.first_step);
      result.replica = process / static_cast<int>(scenario.world_size);
      result.replicas = static_cast<int>(scenario.data_parallel);
      ranks.push_back(std::move(result));
    }
    CheckCompleteness(ranks, scenario.steps);
  } catch (const ProtocolError& error) {
    return FailedScenarioReport(scenario, reports::Status::kError,
                                fmt::format("trainer {} broke the protocol: {}", scenario.trainer, error.what()));
  }
  // Nothing planned: another trainer's messages are its own business; no prediction of ours applies.
  const auto schedule = pipeline::EmptySchedule(scenario.schedule, shape, /*virtual_stages_allowed=*/true);
  const pipeline::SimulationResult simulation;
  const pipeline::MemoryPrediction memory;
  ParityInput input{scenario, oracle, ranks, schedule, simulation, memory, /*check_communication=*/false, &view};
  if (segment.count > 1) input.segment = &segment;
  auto report = CompareWithReference(input);
  report.summary.bubble_theory.reset();
  if (report.summary.bubble_measured && std::isnan(*report.summary.bubble_measured)) report.summary.bubble_measured.reset();
  return report;
}

std::string TrainerPython() {
  const char* python = std::getenv("PIPECHECK_PYTHON");
  return python != nullptr && *python != '\0' ? python : PIPECHECK_PYTHON_DEFAULT;
}

namespace {

// What an exec'd rank of each adapter runs first, before any of the adapter's own code: its
// module-level imports and protocol.py's. No more: what an adapter imports later may depend on
// what it did before (TorchTitan's and Megatron-Core's CPU shims must precede their imports, and
// PyTorch's checkpointing binds the device-type function the first replaces as it is imported).
constexpr char kPipeliningPreload[] =
    "import torch, torch.distributed, torch.nn, torch.nn.functional, torch.utils.checkpoint, "
    "torch.distributed.pipelining";
constexpr char kTorchtitanPreload[] =
    "import torch, torch.distributed, torch.nn, torch.nn.functional, torch.utils.checkpoint, torch.distributed.tensor";
constexpr char kDeepspeedPreload[] = "import torch, torch.distributed, torch.nn, torch.nn.functional, torch.utils.checkpoint";
constexpr char kMegatronPreload[] = "import torch, torch.distributed, torch.nn, torch.nn.functional, torch.utils.checkpoint";

// The trainers pipecheck ships an adapter for: the adapter's file in trainers/, the import that
// proves the trainer is installed, how to install it, and what the Python fork server
// (trainers/fork_server.py) imports before it forks the adapter's ranks on the CPU.
struct Adapter {
  const char* trainer;
  const char* file;
  const char* probe;
  const char* install;
  const char* preload;
};
constexpr Adapter kAdapters[] = {
    {"torch", "torch_pipelining.py", "import torch, torch.distributed.pipelining",
     "PyTorch >= 2.4 (torch.distributed.pipelining)", kPipeliningPreload},
    {"torchtitan", "torchtitan_adapter.py", "import torch, torchtitan.trainer",
     "TorchTitan (requirements.txt pins it; `make deps` installs it into .venv)", kTorchtitanPreload},
    {"deepspeed", "deepspeed_adapter.py", "import torch, deepspeed.pipe",
     "DeepSpeed (requirements-frameworks.txt pins it; `make frameworks` installs it into .venv)", kDeepspeedPreload},
    {"megatron", "megatron_adapter.py", "import torch, megatron.core.pipeline_parallel",
     "Megatron-Core (requirements-frameworks.txt pins it; `make frameworks` installs it into .venv)",
     kMegatronPreload},
};

const Adapter* AdapterOf(const std::string& trainer) {
  for (const auto& adapter : kAdapters) {
    if (trainer == adapter.trainer) return &adapter;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> TrainerCommand(const scenarios::Scenario& scenario) {
  if (const auto* adapter = AdapterOf(scenario.trainer)) {
    return {TrainerPython(), (fs::path(PIPECHECK_SOURCE_DIR) / "trainers" / adapter->file).string()};
  }
  if (EndsWith(scenario.trainer_path, ".py")) return {TrainerPython(), fs::absolute(scenario.trainer_path).string()};
  return {fs::absolute(scenario.trainer_path).string()};
}

std::string TrainerPreload(const scenarios::Scenario& scenario) {
  const auto* adapter = AdapterOf(scenario.trainer);
  return adapter != nullptr && scenario.device == "cpu" ? adapter->preload : "";
}

std::string TrainerForkServer() { return (fs::path(PIPECHECK_SOURCE_DIR) / "trainers" / "fork_server.py").string(); }

std::vector<std::pair<std::string, std::string>> TrainerEnvironment(const scenarios::Scenario& scenario,
                                                                    const std::string& directory, int threads) {
  std::vector<std::pair<std::string, std::string>> environment = {
      {"PIPECHECK_IN", fs::absolute(ExchangeInputs(directory)).string()},
      {"PIPECHECK_OUT", fs::absolute(ExchangeOutputs(directory)).string()},
      {"PIPECHECK_FAULT", scenario.fault},
      {"PIPECHECK_THREADS", std::to_string(threads)},
      {"PYTHONUNBUFFERED", "1"},
      // The host allocator settings pipecheck's own ranks run with (reference/host_memory.h), as
      // glibc reads them from the environment: no block mapped and unmapped, the heap never
      // trimmed; so neither trainer pays page faults the other does not.
      {"MALLOC_MMAP_MAX_", "0"},
      {"MALLOC_TRIM_THRESHOLD_", "2147483647"},
  };
  const std::string meter = PIPECHECK_METER_LIBRARY;
  std::error_code error;
  if (!meter.empty() && fs::exists(meter, error)) environment.emplace_back("PIPECHECK_METER", meter);
  return environment;
}

std::string TrainerProblem(const scenarios::Scenario& scenario) {
  if (!scenario.ExternalTrainer()) return "";
  const auto command = TrainerCommand(scenario);
  if (const auto* adapter = AdapterOf(scenario.trainer)) {
    // By interpreter and trainer: one probe per run.
    static std::map<std::pair<std::string, std::string>, std::string> checked;
    const std::string python = command.front();
    const auto key = std::make_pair(python, scenario.trainer);
    if (!checked.count(key)) {
      int status = 0;
      const std::string probe = fmt::format("{}; print(torch.__version__)", adapter->probe);
      const std::string said = RunForOutput(Quoted(python) + " -c '" + probe + "' 2>&1", status);
      checked[key] = status == 0 ? ""
                                 : fmt::format("trainer={} needs {} in {} (set PIPECHECK_PYTHON to another): {}",
                                               scenario.trainer, adapter->install, python, said);
    }
    return checked[key];
  }
  std::error_code error;
  const std::string program = fs::absolute(scenario.trainer_path).string();
  if (!fs::is_regular_file(program, error)) return fmt::format("trainer program {} is not there", program);
  if (command.size() == 1 && access(program.c_str(), X_OK) != 0) {
    return fmt::format("trainer program {} is not executable (a .py file runs with {})", program, TrainerPython());
  }
  return "";
}

}  // namespace pipecheck::harness
