// The invariance matrix (see invariance.h).
#include "harness/invariance.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "harness/errors.h"
#include "harness/launcher.h"
#include "harness/suite_runner.h"
#include "harness/parity.h"
#include "harness/runnable.h"
#include "harness/scenario_model.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_name.h"
#include "pipeline/stage.h"
#include "pipeline/trainer.h"
#include "reports/csv.h"
#include "reports/report.h"
#include "reports/trace.h"
#include "scenarios/dtypes.h"

namespace pipecheck::harness {
namespace {

using scenarios::Scenario;

// Stages per rank a schedule runs with when the base scenario does not say.
int64_t VirtualStagesFor(const std::string& schedule, const Scenario& base) {
  if (schedule == base.schedule) return base.virtual_stages;
  const pipeline::ScheduleInfo* info = pipeline::FindSchedule(schedule);
  return info ? info->default_virtual_stages : 1;
}

bool ExplicitPartition(const std::string& partition) { return partition != "uniform" && partition != "params"; }

// Partitions tried on `stages` stages: uniform, params, every layer on the first stage and every
// layer on the last (the rest empty stages).
std::vector<std::pair<std::string, std::string>> PartitionsFor(int64_t stages, int64_t layers) {
  std::vector<std::pair<std::string, std::string>> partitions = {{"uniform", "uniform"}, {"params", "params"}};
  if (stages < 2) return partitions;
  std::vector<std::string> front(stages, "0"), back(stages, "0");
  front.front() = std::to_string(layers);
  back.back() = std::to_string(layers);
  partitions.emplace_back("front", fmt::format("{}", fmt::join(front, ";")));
  partitions.emplace_back("back", fmt::format("{}", fmt::join(back, ";")));
  return partitions;
}

std::string PartitionLabel(const std::string& partition) {
  if (!ExplicitPartition(partition)) return partition;
  std::string label = partition;
  std::replace(label.begin(), label.end(), ';', '-');
  return label;
}

std::string Label(const Scenario& s, const Scenario& base, const std::string& partition_label) {
  std::string label = fmt::format("ws{}.{}", s.world_size, pipeline::IsScheduleCsv(s.schedule) ? "csv" : s.schedule);
  if (s.virtual_stages > 1) label += fmt::format(".v{}", s.virtual_stages);
  label += "." + partition_label;
  if (s.microbatches != base.microbatches) label += fmt::format(".m{}", s.microbatches);
  if (s.data_parallel > 1) label += fmt::format(".dp{}", s.data_parallel);
  if (s.recompute) label += ".rc";
  return label;
}

// Why `s` cannot run here ("" when it can): the loader's verdict on it as a one-row suite, then
// what this host lacks.
std::string ProblemOf(const Scenario& s, const std::string& label) {
  try {
    ParseSuite(scenarios::ToCsv({s}), "variant " + label);
  } catch (const scenarios::ScenarioError& error) {
    const std::string text = error.what();
    const auto column = text.find("column '");  // drop "variant LABEL:2:C: " for a shorter reason
    return column == std::string::npos ? text : text.substr(column);
  }
  return UnmetRequirement(s);
}

// What makes two variants the same pipeline: sizes, schedule and each stage's layer count.
std::string Identity(const Scenario& s) {
  const auto counts = pipeline::PartitionLayers(ToModelConfig(s), s.world_size * s.virtual_stages, s.partition);
  return fmt::format("{}|{}|{}|{}|{}|{}|{}", s.world_size, s.schedule, s.virtual_stages, s.microbatches,
                     fmt::join(counts, ";"), s.data_parallel, s.recompute);
}

// The model's units in order, each stage's units, and names for them.
std::vector<std::string> UnitsOf(const reference::SliceSpec& slice) {
  std::vector<std::string> units;
  if (slice.has_embedding) units.push_back("embedding");
  for (int64_t layer = slice.first_layer; layer < slice.end_layer; ++layer) units.push_back(fmt::format("layer {}", layer));
  if (slice.has_head) units.push_back("head");
  return units;
}

std::string Orders(const std::vector<int>& order) { return fmt::format("{}", fmt::join(order, ",")); }

std::string Groups(const std::vector<std::vector<std::string>>& groups) {
  std::vector<std::string> parts;
  for (const auto& group : groups) {
    parts.push_back(fmt::format("{}", fmt::join(group, ", ")));
  }
  return fmt::format("{{{}}}", fmt::join(parts, " | "));
}

bool SameBits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto x = a.contiguous().cpu(), y = b.contiguous().cpu();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Merges the ranks' per-name tensors: one entry per parameter (a copy's key NAME@stageS counts as
// NAME), the lowest rank's copy first.
reference::NamedTensors Merge(const std::vector<const reference::NamedTensors*>& parts) {
  reference::NamedTensors merged;
  for (const auto* part : parts) {
    for (const auto& item : *part) {
      const std::string name = pipeline::ParameterName(item.key());
      if (!merged.contains(name)) merged.insert(name, item.value());
    }
  }
  return merged;
}

std::string Short(double value) {
  if (std::isnan(value)) return "nan";
  if (value == 0.0) return "0";
  return fmt::format("{:.1e}", value);
}

// Of the (scenario, partition label, axis) candidates, those that can run, each pipeline once (the
// first name it was listed under); the others go to `skipped` with the loader's reason.
std::vector<Variant> RunnableVariants(const Scenario& base,
                                      std::vector<std::tuple<Scenario, std::string, std::string>> candidates,
                                      std::vector<SkippedVariant>* skipped) {
  std::vector<Variant> variants;
  std::set<std::string> seen;
  for (auto& [s, partition_label, axis] : candidates) {
    const std::string label = Label(s, base, partition_label);
    s.name = base.name + "." + label;
    const std::string problem = ProblemOf(s, label);
    if (!problem.empty()) {
      if (skipped && std::none_of(skipped->begin(), skipped->end(), [&](const auto& k) { return k.label == label; })) {
        skipped->push_back({label, problem});
      }
      continue;
    }
    if (!seen.insert(Identity(s)).second) continue;  // the same pipeline under another name or axis
    variants.push_back({s, label, axis});
  }
  return variants;
}

}  // namespace

namespace {

// Variants to try, in the order they are listed: (scenario, partition label, axis).
class Candidates {
 public:
  explicit Candidates(const Scenario& base) : base_(base) {}

  Scenario& Add(int64_t ws, const std::string& schedule, int64_t virtual_stages, const std::string& partition,
                const std::string& partition_label, int64_t microbatches, const std::string& axis) {
    Scenario s = base_;
    s.world_size = ws;
    s.schedule = schedule;
    s.virtual_stages = virtual_stages;
    s.partition = partition;
    s.microbatches = microbatches;
    s.transport = "auto";  // each variant's own ranks pick theirs
    list_.emplace_back(s, partition_label, axis);
    return std::get<0>(list_.back());
  }
  // The base with one thing changed (axis), its shape and partition kept.
  Scenario& AddBase(const std::string& axis, int64_t microbatches) {
    return Add(base_.world_size, base_.schedule, base_.virtual_stages, base_.partition, PartitionLabel(base_.partition),
               microbatches, axis);
  }
  std::vector<std::tuple<Scenario, std::string, std::string>> Take() { return std::move(list_); }

 private:
  const Scenario& base_;
  std::vector<std::tuple<Scenario, std::string, std::string>> list_;
};

// The shapes: with --full every world size x schedule x partition; else one axis at a time.
void AddShapes(const Scenario& base, const InvarianceOptions& options, const std::vector<int64_t>& world_sizes,
               const std::vector<std::string>& schedules, Candidates& candidates) {
  if (options.full) {
    for (const int64_t ws : world_sizes) {
      for (const auto& schedule : schedules) {
        const int64_t v = VirtualStagesFor(schedule, base);
        for (const auto& [label, partition] : PartitionsFor(ws * v, base.layers)) {
          candidates.Add(ws, schedule, v, partition, label, base.microbatches, "full");
        }
      }
    }
    return;
  }
  // Another shape keeps the base's partition only if it is a rule (uniform, params).
  const std::string portable = ExplicitPartition(base.partition) ? "uniform" : base.partition;
  for (const int64_t ws : world_sizes) {
    candidates.Add(ws, base.schedule, base.virtual_stages, portable, PartitionLabel(portable), base.microbatches,
                   "world_size");
  }
  for (const auto& [label, partition] : PartitionsFor(base.world_size * base.virtual_stages, base.layers)) {
    candidates.Add(base.world_size, base.schedule, base.virtual_stages, partition, label, base.microbatches,
                   "partition");
  }
  for (const auto& schedule : schedules) {
    const int64_t v = VirtualStagesFor(schedule, base);
    candidates.Add(base.world_size, schedule, v, portable, PartitionLabel(portable), base.microbatches, "schedule");
  }
}

}  // namespace

std::vector<Variant> InvarianceVariants(const Scenario& base, const InvarianceOptions& options,
                                        std::vector<SkippedVariant>* skipped) {
  std::vector<int64_t> world_sizes = options.world_sizes;
  if (world_sizes.empty()) {
    for (int64_t ws = 1; ws <= std::max<int64_t>(4, base.world_size); ++ws) world_sizes.push_back(ws);
  }
  std::vector<std::string> schedules = pipeline::ScheduleNames();
  if (std::find(schedules.begin(), schedules.end(), base.schedule) == schedules.end()) {
    schedules.push_back(base.schedule);  // a csv: schedule, for the base's shape
  }
  Candidates candidates(base);
  candidates.AddBase("base", base.microbatches);
  AddShapes(base, options, world_sizes, schedules, candidates);
  for (const int64_t m : options.microbatches) candidates.AddBase("microbatches", m);
  // Replicas of the base's pipeline (data parallelism changes the order of the gradient sum), and
  // the base with recomputation switched (which changes no arithmetic).
  std::vector<int64_t> replica_counts = options.data_parallel;
  if (replica_counts.empty()) replica_counts = {1, 2};
  for (const int64_t dp : replica_counts) candidates.AddBase("data_parallel", base.microbatches).data_parallel = dp;
  candidates.AddBase("recompute", base.microbatches).recompute = !base.recompute;
  return RunnableVariants(base, candidates.Take(), skipped);
}

ArithmeticKey ArithmeticOf(const Scenario& scenario) {
  const auto config = ToPipelineConfig(scenario);
  const auto schedule = pipeline::BuildSchedule(config);
  const auto& shape = schedule.shape;
  const auto slices = pipeline::StageSlicesOf(config, shape);
  const int last = shape.stages() - 1;
  std::vector<std::vector<int>> stage_orders(shape.stages());
  ArithmeticKey key;
  key.device = scenario.device;
  key.dtype = scenario.dtype;
  key.microbatches = scenario.microbatches * scenario.data_parallel;  // the global batch's split
  key.data_parallel = scenario.data_parallel;
  for (const auto& actions : schedule.ranks) {
    for (const auto& action : actions) {
      // Parameter gradients are added into .grad by a full backward or by a weight-gradient step.
      if (action.kind == pipeline::ActionKind::kBackward || action.kind == pipeline::ActionKind::kBackwardWeight) {
        stage_orders[action.stage].push_back(action.microbatch);
      }
      if (action.kind == pipeline::ActionKind::kForward && action.stage == last) key.loss_order.push_back(action.microbatch);
    }
  }
  for (int stage = 0; stage < shape.stages(); ++stage) {
    for (const auto& unit : UnitsOf(slices[stage])) key.accumulation.emplace_back(unit, stage_orders[stage]);
  }
  key.tied = scenario.tied;
  key.tied_in_one_stage = shape.stages() == 1;
  if (scenario.clip > 0.0) {
    for (int rank = 0; rank < shape.ranks; ++rank) {
      std::vector<std::string> group;
      for (int stage = 0; stage < shape.stages(); ++stage) {
        if (shape.RankOfStage(stage) != rank) continue;
        for (const auto& unit : UnitsOf(slices[stage])) group.push_back(unit);
      }
      if (!group.empty()) key.norm_groups.push_back(group);  // a rank with no parameters adds an exact 0
    }
  }
  return key;
}

ArithmeticKey ReferenceArithmetic(const Scenario& scenario) {
  ArithmeticKey key;
  key.device = scenario.device;
  key.dtype = scenario.dtype;
  key.microbatches = 1;
  const auto config = ToModelConfig(scenario);
  const auto units = UnitsOf(reference::WholeModel(config));
  for (const auto& unit : units) key.accumulation.emplace_back(unit, std::vector<int>{0});
  key.loss_order = {0};
  key.tied = scenario.tied;
  key.tied_in_one_stage = true;
  if (scenario.clip > 0.0) key.norm_groups = {units};
  return key;
}

std::string ArithmeticDifference(const ArithmeticKey& a, const ArithmeticKey& b) {
  if (a.device != b.device) return fmt::format("device {} vs {}", a.device, b.device);
  if (a.dtype != b.dtype) return fmt::format("dtype {} vs {}", a.dtype, b.dtype);
  if (a.microbatches != b.microbatches) {
    return fmt::format("{} vs {} microbatches: other rows in each matmul", a.microbatches, b.microbatches);
  }
  if (a.data_parallel != b.data_parallel) {
    return fmt::format("{} vs {} replicas: each replica sums its own microbatches' gradients, then the replicas' "
                       "sums are added", a.data_parallel, b.data_parallel);
  }
  // With one microbatch both ways are one sum of two terms, and addition commutes.
  if (a.tied && a.microbatches > 1 && a.tied_in_one_stage != b.tied_in_one_stage) {
    auto how = [](bool one) { return one ? "summed inside one stage's backward" : "accumulated per copy, then summed"; };
    return fmt::format("tied weight's two uses {} vs {}", how(a.tied_in_one_stage), how(b.tied_in_one_stage));
  }
  if (a.loss_order != b.loss_order) {
    return fmt::format("loss terms summed in microbatch order {} vs {}", Orders(a.loss_order), Orders(b.loss_order));
  }
  if (a.accumulation.size() != b.accumulation.size()) return "different model units";
  for (size_t i = 0; i < a.accumulation.size(); ++i) {
    if (a.accumulation[i] != b.accumulation[i]) {
      return fmt::format("{}'s gradient accumulated over microbatches {} vs {}", a.accumulation[i].first,
                         Orders(a.accumulation[i].second), Orders(b.accumulation[i].second));
    }
  }
  if (a.norm_groups != b.norm_groups) {
    return fmt::format("clipping norm summed in rank groups {} vs {}", Groups(a.norm_groups), Groups(b.norm_groups));
  }
  return "";
}

TrainedTensors FromRanks(const std::vector<pipeline::RankResult>& ranks) {
  TrainedTensors tensors;
  size_t steps = 0;
  for (const auto& rank : ranks) steps = std::max(steps, rank.losses.size());
  for (size_t step = 0; step < steps; ++step) {
    double loss = std::nan("");
    std::vector<const reference::NamedTensors*> gradients;
    for (const auto& rank : ranks) {
      if (step < rank.losses.size() && !std::isnan(rank.losses[step]) && std::isnan(loss)) loss = rank.losses[step];
      if (step < rank.gradients.size()) gradients.push_back(&rank.gradients[step]);
    }
    tensors.losses.push_back(loss);
    tensors.gradients.push_back(Merge(gradients));
  }
  std::vector<const reference::NamedTensors*> finals;
  for (const auto& rank : ranks) finals.push_back(&rank.final_weights);
  tensors.final_weights = Merge(finals);
  return tensors;
}

TrainedTensors FromReference(const reference::TrainResult& result) {
  TrainedTensors tensors;
  for (const auto& step : result.steps) {
    tensors.losses.push_back(step.loss);
    tensors.gradients.push_back(step.gradients);
  }
  tensors.final_weights = result.final_weights;
  return tensors;
}

void SaveTrainedTensors(const TrainedTensors& tensors, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (size_t step = 0; step < tensors.losses.size(); ++step) {
    dict.insert(fmt::format("loss/{}", step), torch::tensor(tensors.losses[step], torch::kFloat64));
    for (const auto& item : tensors.gradients[step]) {
      dict.insert(fmt::format("grad/{}/{}", step, item.key()), item.value().detach().cpu());
    }
  }
  for (const auto& item : tensors.final_weights) dict.insert("final/" + item.key(), item.value().detach().cpu());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  reports::WriteFileAtomically(path, std::string(bytes.begin(), bytes.end()));
}

TrainedTensors LoadTrainedTensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error(fmt::format("cannot read {}", path));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto dict = torch::pickle_load(bytes).toGenericDict();
  TrainedTensors tensors;
  auto step_slot = [&](const std::string& text) {
    const size_t step = std::stoul(text);
    if (step >= 100000) throw std::runtime_error(fmt::format("{}: step {} out of range", path, step));
    if (tensors.losses.size() <= step) {
      tensors.losses.resize(step + 1, std::nan(""));
      tensors.gradients.resize(step + 1);
    }
    return step;
  };
  for (const auto& entry : dict) {
    const std::string key = entry.key().toStringRef();
    const torch::Tensor value = entry.value().toTensor();
    if (key.rfind("loss/", 0) == 0) {
      tensors.losses[step_slot(key.substr(5))] = value.item<double>();
    } else if (key.rfind("grad/", 0) == 0) {
      const auto slash = key.find('/', 5);
      if (slash == std::string::npos) throw std::runtime_error(fmt::format("{}: bad key {}", path, key));
      tensors.gradients[step_slot(key.substr(5, slash - 5))].insert(key.substr(slash + 1), value);
    } else if (key.rfind("final/", 0) == 0) {
      tensors.final_weights.insert(key.substr(6), value);
    } else {
      throw std::runtime_error(fmt::format("{}: unexpected key {}", path, key));
    }
  }
  return tensors;
}

PairComparison CompareTrained(const TrainedTensors& a, const TrainedTensors& b, double floor_fraction) {
  PairComparison c;
  c.bitwise = true;
  if (a.losses.size() != b.losses.size()) {
    c.problem = fmt::format("{} vs {} steps", a.losses.size(), b.losses.size());
    c.bitwise = false;
  }
  const size_t steps = std::min(a.losses.size(), b.losses.size());
  auto note = [&](const std::string& problem) {
    c.bitwise = false;
    if (c.problem.empty()) c.problem = problem;
  };
  auto same = [&](bool equal, const std::string& where) {
    if (!equal && c.first_difference.empty()) c.first_difference = where;
    c.bitwise = c.bitwise && equal;
  };
  for (size_t step = 0; step < steps; ++step) {
    same(SameBits(a.losses[step], b.losses[step]), fmt::format("step {} loss", step));
    c.loss_max_abs_diff = std::max(c.loss_max_abs_diff, std::abs(a.losses[step] - b.losses[step]));
    if (std::isnan(a.losses[step]) != std::isnan(b.losses[step])) note(fmt::format("step {}: a loss on one side only", step));
    double total = 0.0;
    for (const auto& item : b.gradients[step]) total += item.value().to(torch::kFloat64).pow(2).sum().item<double>();
    const double floor = floor_fraction * std::sqrt(total);
    for (const auto& item : a.gradients[step]) {
      const auto* other = b.gradients[step].find(item.key());
      if (!other) {
        note(fmt::format("step {}: {} has no counterpart", step, item.key()));
        continue;
      }
      if (item.value().sizes() != other->sizes()) {
        note(fmt::format("step {}: {} shaped {} vs {}", step, item.key(), item.value().sizes(), other->sizes()));
        continue;
      }
      same(SameBits(item.value(), *other), fmt::format("step {} {}", step, item.key()));
      const auto x = item.value().to(torch::kFloat64), y = other->to(torch::kFloat64);
      const double max_abs = (x - y).abs().max().item<double>();
      const double rel = (x - y).norm().item<double>() / std::max(y.norm().item<double>(), floor);
      c.grad_max_abs_diff = std::max(c.grad_max_abs_diff, max_abs);
      if (rel > c.grad_max_rel_err || (std::isnan(rel) && !std::isnan(c.grad_max_rel_err))) {
        c.grad_max_rel_err = rel;
        c.worst_param = fmt::format("step {} {}", step, item.key());
      }
    }
    if (a.gradients[step].size() != b.gradients[step].size()) {
      note(fmt::format("step {}: {} vs {} gradients", step, a.gradients[step].size(), b.gradients[step].size()));
    }
  }
  for (const auto& item : a.final_weights) {
    const auto* other = b.final_weights.find(item.key());
    if (!other || item.value().sizes() != other->sizes()) {
      note(fmt::format("final weight {} has no counterpart", item.key()));
      continue;
    }
    same(SameBits(item.value(), *other), "final " + item.key());
    c.weights_max_abs_diff = std::max(
        c.weights_max_abs_diff, (item.value().to(torch::kFloat64) - other->to(torch::kFloat64)).abs().max().item<double>());
  }
  if (a.final_weights.size() != b.final_weights.size()) note("final weights differ in number");
  return c;
}

const std::vector<std::string>& InvarianceColumns() {
  static const std::vector<std::string> columns = {
      "scenario", "a", "b", "same_arithmetic", "asserted", "bitwise", "loss_max_abs_diff", "grad_max_abs_diff",
      "grad_max_rel_err", "worst_param", "weights_max_abs_diff", "first_bits_differ", "ok", "difference"};
  return columns;
}

InvarianceMatrix BuildMatrix(const std::vector<MatrixEntry>& entries, double floor_fraction, bool assert_bitwise) {
  InvarianceMatrix matrix;
  const size_t n = entries.size();
  for (const auto& entry : entries) matrix.labels.push_back(entry.label);
  std::vector<std::vector<bool>> same_arithmetic(n, std::vector<bool>(n, true));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      MatrixPair pair;
      pair.a = i;
      pair.b = j;
      pair.difference = ArithmeticDifference(entries[i].key, entries[j].key);
      pair.comparison = CompareTrained(entries[j].tensors, entries[i].tensors, floor_fraction);
      pair.same_arithmetic = pair.difference.empty();
      pair.asserted = pair.same_arithmetic && assert_bitwise;
      pair.ok = !pair.asserted || pair.comparison.bitwise;
      same_arithmetic[i][j] = same_arithmetic[j][i] = pair.same_arithmetic;
      matrix.asserted += pair.asserted;
      matrix.bitwise += pair.comparison.bitwise;
      matrix.broken += !pair.ok;
      matrix.pairs.push_back(std::move(pair));
    }
  }
  // Classes: each entry not yet placed opens one, joined by every later entry of its arithmetic.
  std::vector<bool> placed(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (placed[i]) continue;
    placed[i] = true;
    matrix.classes.push_back({i});
    for (size_t j = i + 1; j < n; ++j) {
      if (!placed[j] && same_arithmetic[i][j]) {
        placed[j] = true;
        matrix.classes.back().push_back(j);
      }
    }
  }
  return matrix;
}

std::string InvarianceCsv(const std::string& scenario, const InvarianceMatrix& matrix) {
  reports::CsvTable table(InvarianceColumns());
  for (const auto& pair : matrix.pairs) {
    const auto& c = pair.comparison;
    table.AddRow({scenario, matrix.labels[pair.a], matrix.labels[pair.b], pair.same_arithmetic ? "1" : "0",
                  pair.asserted ? "1" : "0", c.bitwise ? "1" : "0", reports::FormatNumber(c.loss_max_abs_diff),
                  reports::FormatNumber(c.grad_max_abs_diff), reports::FormatNumber(c.grad_max_rel_err), c.worst_param,
                  reports::FormatNumber(c.weights_max_abs_diff), c.first_difference, pair.ok ? "1" : "0",
                  pair.same_arithmetic ? c.problem : pair.difference + (c.problem.empty() ? "" : "; " + c.problem)});
  }
  return table.ToString();
}

namespace {

// "=" bitwise and asserted, "=*" bitwise where the arithmetic differs, "!" asserted but not bitwise
// (with the gradients' relative error), else the relative error.
std::string MatrixCell(const MatrixPair& pair) {
  const auto& c = pair.comparison;
  if (c.bitwise) return pair.asserted ? "=" : "=*";
  return (pair.ok ? "" : "!") + Short(c.grad_max_rel_err);
}

}  // namespace

void PrintMatrix(std::ostream& out, const InvarianceMatrix& matrix) {
  const size_t n = matrix.labels.size();
  std::vector<std::vector<std::string>> cells(n, std::vector<std::string>(n, ""));
  for (size_t i = 0; i < n; ++i) cells[i][i] = "·";
  for (const auto& pair : matrix.pairs) cells[pair.a][pair.b] = cells[pair.b][pair.a] = MatrixCell(pair);
  fmt::print(out, "\ngradients, max rel err over steps and parameters (=: bitwise equal, asserted; =*: bitwise equal "
                  "where the arithmetic differs; !: asserted but not bitwise):\n");
  for (size_t i = 0; i < n; ++i) fmt::print(out, "  [{}] {}\n", i, matrix.labels[i]);
  fmt::print(out, "\n{:>5}", "");
  for (size_t j = 0; j < n; ++j) fmt::print(out, " {:>8}", fmt::format("[{}]", j));
  fmt::print(out, "\n");
  for (size_t i = 0; i < n; ++i) {
    fmt::print(out, "{:>5}", fmt::format("[{}]", i));
    for (size_t j = 0; j < n; ++j) fmt::print(out, " {:>8}", cells[i][j]);
    fmt::print(out, "\n");
  }
  fmt::print(out, "\nthe same arithmetic in the same order ({} classes):\n", matrix.classes.size());
  for (const auto& members : matrix.classes) {
    std::vector<std::string> names;
    for (size_t i : members) names.push_back(fmt::format("[{}] {}", i, matrix.labels[i]));
    fmt::print(out, "  {}\n", fmt::join(names, ", "));
  }
  constexpr int kShown = 10;
  int shown = 0;
  for (const auto& pair : matrix.pairs) {
    if (pair.ok || shown++ >= kShown) continue;
    const auto& c = pair.comparison;
    fmt::print(out, "NOT BITWISE: {} vs {}: the same arithmetic, but not bitwise equal: first at {} (grad rel err up "
                    "to {}, loss diff {}){}\n",
               matrix.labels[pair.a], matrix.labels[pair.b], c.first_difference, Short(c.grad_max_rel_err),
               Short(c.loss_max_abs_diff), c.problem.empty() ? "" : "; " + c.problem);
  }
  if (matrix.broken > kShown) {
    fmt::print(out, "NOT BITWISE: and {} more pairs (invariance.csv, ok=0)\n", matrix.broken - kShown);
  }
}

namespace {

// Runs every variant as a scenario of its own (ranks save their tensors) with the suite runner,
// each line naming the variant and its axis, the run reports rewritten after each; `failed`
// counts those that missed their expectation. A SIGINT or SIGTERM ends it: `interrupted` gets the
// signal, and what ran so far is returned.
std::vector<reports::ScenarioReport> RunVariants(const std::vector<Variant>& variants, const InvarianceOptions& options,
                                                 std::ostream& out, int& failed, int& interrupted) {
  SuiteRunOptions suite;
  suite.launch.executable = CurrentExecutable();
  suite.launch.work_directory = (std::filesystem::path(options.out) / "work").string();
  suite.launch.worker_args = {"--save-tensors"};
  suite.launch.timed_steps = 0;  // the variants are compared for their numbers; their speed is not gated
  suite.launch.timed_steps_given = true;  // whatever a row says
  suite.timeout_seconds = options.timeout_seconds;
  suite.threads_per_rank = options.threads;  // the same in every variant: the matrix compares their bits
  std::vector<Scenario> scenarios;
  std::vector<std::string> labels;
  size_t width = 8;
  for (const auto& variant : variants) width = std::max(width, variant.label.size());
  for (const auto& variant : variants) {
    scenarios.push_back(variant.scenario);
    labels.push_back(fmt::format("{:<{}} {:<12}", variant.label, width, variant.axis));
  }
  auto run = RunScenarios(scenarios, labels, suite, out, [&](const std::vector<reports::ScenarioReport>& finished) {
    reports::WriteReports(options.out, finished);
  });
  if (run.interrupted != 0) {
    fmt::print(out, "\ninterrupted by signal {} during {}\n", run.interrupted, scenarios[run.reports.size()].name);
  }
  interrupted = run.interrupted;
  failed = run.not_ok;
  return std::move(run.reports);
}

// The matrix's entries: the reference (trained here) first, then every variant that left its tensors.
std::vector<MatrixEntry> MatrixEntries(const Scenario& base, const std::vector<Variant>& variants,
                                       const std::vector<reports::ScenarioReport>& reports,
                                       const std::filesystem::path& directory, std::ostream& out) {
  std::vector<MatrixEntry> entries;
  auto config = ToTrainConfig(base);
  config.record_gradients = true;
  reference::ReferenceTrainer reference(config);
  entries.push_back({"reference", ReferenceArithmetic(base), FromReference(reference.Train())});
  for (size_t i = 0; i < variants.size(); ++i) {
    const auto path = directory / "work" / variants[i].scenario.name / kTensorsFile;
    if (!std::filesystem::exists(path)) {
      fmt::print(out, "  {}: left no tensors ({}), not in the matrix\n", variants[i].label, reports::StatusName(reports[i].summary.status));
      continue;
    }
    entries.push_back({variants[i].label, ArithmeticOf(variants[i].scenario), LoadTrainedTensors(path.string())});
  }
  return entries;
}

}  // namespace

int RunInvariance(const Scenario& base, const InvarianceOptions& options, std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<SkippedVariant> skipped;
  const auto variants = InvarianceVariants(base, options, &skipped);
  const std::filesystem::path directory = options.out;
  std::filesystem::create_directories(directory);
  std::vector<Scenario> suite;
  for (const auto& variant : variants) suite.push_back(variant.scenario);
  // For people: the variants as a suite, which `pipecheck run --scenarios` reruns (their ranks read
  // the plans the launcher writes, not this file).
  const auto suite_path = std::filesystem::absolute(directory / "variants.csv");
  reports::WriteFileAtomically(suite_path.string(), scenarios::ToCsv(suite));
  // The bitwise claim holds for float64 on the host, every variant with the same threads.
  const bool asserts = scenarios::DtypeOf(base.dtype).bitwise_on_cpu && base.device == "cpu";
  fmt::print(out, "invariance of {} ({}): {} variants, {} skipped; {} thread(s) per rank in every variant; {}\n",
             base.name, base.source, variants.size(), skipped.size(), options.threads,
             asserts ? "bitwise equality asserted where the arithmetic is the same (float64 on the CPU)"
                     : fmt::format("bitwise equality reported, not asserted ({} on {}: only float64 on the CPU is)",
                                   base.dtype, base.device));
  for (const auto& skip : skipped) fmt::print(out, "  skipped {}: {}\n", skip.label, skip.reason);

  int failed_variants = 0, interrupted = 0;
  const auto reports = RunVariants(variants, options, out, failed_variants, interrupted);
  if (interrupted != 0) return 128 + interrupted;
  const auto entries = MatrixEntries(base, variants, reports, directory, out);
  const auto matrix = BuildMatrix(entries, scenarios::DtypeOf(base.dtype).floor_fraction, asserts);
  const auto csv_path = directory / "invariance.csv";
  reports::WriteFileAtomically(csv_path.string(), InvarianceCsv(base.name, matrix));
  PrintMatrix(out, matrix);
  const size_t n = entries.size();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(out, "\n{} variants, {} did not meet their expectation; {} pairs, {} bitwise equal, {} asserted, {} of "
                  "those not bitwise; {:.1f} s\nreports: {}, {}, {} and the run reports (summary.csv, ...) in {}\n",
             variants.size(), failed_variants, n * (n - 1) / 2, matrix.bitwise, matrix.asserted, matrix.broken,
             seconds, csv_path.string(), suite_path.string(), (directory / "work").string(), options.out);
  return failed_variants == 0 && matrix.broken == 0 ? 0 : 1;
}

}  // namespace pipecheck::harness
