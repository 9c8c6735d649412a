// `pipecheck schedule` (see schedule_command.h).
#include "harness/schedule_command.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "pipeline/lowering.h"
#include "pipeline/message.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_csv.h"
#include "pipeline/simulator.h"
#include "pipeline/trainer.h"
#include "reports/csv.h"

namespace pipecheck::harness {
namespace {

using namespace pipecheck::pipeline;

bool HasAction(const Schedule& schedule, const Action& action) {
  for (const auto& actions : schedule.ranks) {
    if (std::find(actions.begin(), actions.end(), action) != actions.end()) return true;
  }
  return false;
}

// The shape, said first: lowering and simulating thousands of actions per rank takes seconds.
void PrintHeader(const ScheduleOptions& options, const PipelineShape& shape, const Schedule& compute,
                 std::ostream& out) {
  fmt::print(out, "schedule {}: {} ranks{}, {} microbatches{} ({} stages){}\n\n", options.schedule, shape.ranks,
             options.stages_given ? "" : " (the default: --stages)", shape.microbatches,
             options.microbatches_given ? "" : " (the default: --microbatches)", shape.stages(),
             options.accumulation > 1
                 ? fmt::format("; accumulation: {} rounds per optimizer step, one step's schedule of {} microbatches "
                               "(round k is microbatches k x {} .. k x {} + {})",
                               options.accumulation, compute.shape.microbatches, shape.microbatches,
                               shape.microbatches, shape.microbatches - 1)
                 : "");
  out.flush();
}

// Equal costs, and the asked backward cost (a split B costs what B does); with recomputation the
// forward again at the start of every B and I (the trainer's recompute=1).
std::pair<CostModel, CostModel> CostModels(const ScheduleOptions& options, std::ostream& out) {
  CostModel equal;
  CostModel weighted;
  weighted.backward = options.backward_cost;
  weighted.backward_input = weighted.backward_weight = options.backward_cost / 2;
  if (options.recompute) {
    for (CostModel* costs : {&equal, &weighted}) {
      costs->backward += costs->forward;
      costs->backward_input += costs->forward;
    }
    fmt::print(out, "recompute: every B and I first runs its stage's forward again (B = {:g}, I = {:g}, W = {:g} with "
                    "F = 1)\n\n", weighted.backward, weighted.backward_input, weighted.backward_weight);
  }
  return {equal, weighted};
}

// Each rank averages its gradients across the replicas once its last action is done; every
// replica runs the same list, so each rank's all-reduce meets its peers' at the same time.
void PrintDataParallel(const ScheduleOptions& options, const PipelineShape& shape, const SimulationResult& result,
                       std::ostream& out) {
  double step = 0.0;
  std::vector<std::string> spans;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    const double start = result.finish[rank];
    step = std::max(step, start + options.allreduce_cost);
    spans.push_back(fmt::format("rank {} [{:g}, {:g})", rank, start, start + options.allreduce_cost));
  }
  fmt::print(out, "data parallel over {} replicas: each rank's gradient all-reduce (cost {:g}) after its last "
                  "backward: {}; step makespan {:g} (the pipeline alone {:g})\n",
             options.data_parallel, options.allreduce_cost, fmt::join(spans, ", "), step, result.makespan);
}

void WriteCsv(const ScheduleOptions& options, const Schedule& compute, const Schedule& lowered, std::ostream& out) {
  const bool comms = options.csv_format == "compute_comms";
  reports::WriteFileAtomically(options.csv, comms ? ScheduleToCsv(lowered, CsvFormat::kComputeComms)
                                                  : ScheduleToCsv(compute));
  fmt::print(out, "wrote {} (PyTorch pipelining's {} CSV{})\n", options.csv, options.csv_format,
             comms ? ": pipecheck's communication plan, for PyTorch's _PipelineScheduleRuntime to run as written" : "");
}

// What pipecheck's own trainer runs differs from the generator's lists in one way: the drain's
// last backwards split (TrainerRound). Said with the makespan it gives, where it differs.
void PrintTrainersSplit(const ScheduleOptions& options, const PipelineShape& shape, const Schedule& compute,
                        const CostModel& weighted, const SimulationResult& result, std::ostream& out) {
  const Schedule trainer = RepeatRounds(TrainerRound(options.schedule, shape), options.accumulation);
  if (trainer.ranks == compute.ranks) return;
  std::vector<std::string> split;
  for (const auto& actions : trainer.ranks) {
    for (const Action& action : actions) {
      if (action.kind == ActionKind::kBackwardInput && !HasAction(compute, action)) split.push_back(action.ToString());
    }
  }
  const auto drained = ValidateSchedule(LowerSchedule(trainer), weighted, CommunicationModel::kDeviceStreams);
  fmt::print(out, "pipecheck's trainer runs the drain's last backward on each stage with a remote input as I then W, "
                  "its input gradient sent before the weights' ({}): makespan {:g} with F=1, B={:g}, I=W=B/2 "
                  "(the lists above: {:g})\n",
             fmt::join(split, " "), drained.makespan, weighted.backward, result.makespan);
}

}  // namespace

int PrintSchedule(ScheduleOptions options, std::ostream& out) {
  // Without --virtual, the schedule's own default: interleaved, zbv and dualpipev run two stages per rank.
  const auto* info = FindSchedule(options.schedule);
  if (!options.virtual_given && info) options.virtual_stages = info->default_virtual_stages;
  const PipelineShape shape{options.stages, options.virtual_stages, options.microbatches};
  const Schedule compute = RepeatRounds(ScheduleByName(options.schedule, shape), options.accumulation);
  PrintHeader(options, shape, compute, out);
  const Schedule lowered = LowerSchedule(compute);
  const auto [equal, weighted] = CostModels(options, out);
  const auto result = ValidateSchedule(lowered, weighted, CommunicationModel::kDeviceStreams);
  const auto equal_result = ValidateSchedule(lowered, equal, CommunicationModel::kDeviceStreams);
  const auto streams = Simulate(lowered, SendSemantics::kDeviceStreams, weighted);
  fmt::print(out, "actions per rank (communication included):\n{}\n", FormatActions(lowered));
  fmt::print(out, "timeline with F=1, B={:g} (one column per time unit):\n{}\n", weighted.backward,
             FormatTimeline(lowered, result, weighted));
  fmt::print(out, "bubble: {:.4f} with F=1, B={:g}; {:.4f} with {} (1F1B's (p-1)/(m+p-1) = {:.4f})\n", result.bubble,
             weighted.backward, equal_result.bubble,
             options.recompute ? "F=1, B=2 (equal costs, recomputed)" : "equal costs",
             static_cast<double>(shape.ranks - 1) / (shape.microbatches + shape.ranks - 1));
  fmt::print(out, "peak in-flight microbatches per rank: {}\n", fmt::join(result.peak_in_flight, " "));
  if (options.data_parallel > 1) PrintDataParallel(options, shape, result, out);
  std::string formula;
  if (const auto published = PublishedMakespan(compute.name, compute.shape, weighted, &formula)) {
    const double busy = std::accumulate(result.busy.begin(), result.busy.end(), 0.0);
    fmt::print(out, "makespan with F=1, B={:g}: {:g} simulated; published for {}: {} (bubble {:.4f})\n",
               weighted.backward, result.makespan, compute.name, formula, 1.0 - busy / (shape.ranks * *published));
  }
  fmt::print(out, "valid on every transport: gloo and staged (messages wait on the host: makespan {:g} with F=1, "
                  "B={}), nccl (on device streams, one channel per ordered pair of ranks: makespan {:g})\n",
             result.makespan, weighted.backward, streams.makespan);
  PrintTrainersSplit(options, shape, compute, weighted, result, out);
  if (!options.csv.empty()) WriteCsv(options, compute, lowered, out);
  return 0;
}

}  // namespace pipecheck::harness
