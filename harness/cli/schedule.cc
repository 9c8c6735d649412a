// `pipecheck schedule`: print, simulate or export one schedule.
#include "harness/cli/commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <memory>

#include "harness/schedule_command.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_name.h"

namespace pipecheck::cli {

namespace {

// --schedule: a registry name or csv:PATH.
CLI::Validator ScheduleName() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const auto& names = pipeline::ScheduleNames();
        if (const auto path = pipeline::ScheduleCsvPath(value); path && !path->empty()) return "";
        if (std::find(names.begin(), names.end(), value) != names.end()) return "";
        return fmt::format("{} is not a schedule: expected one of {} or csv:PATH", value, fmt::join(names, ", "));
      },
      "SCHEDULE");
}

}  // namespace

Command AddSchedule(CLI::App& app) {
  auto options = std::make_shared<harness::ScheduleOptions>();
  auto* command = app.add_subcommand("schedule", "Print a schedule's per-rank actions, timeline and bubble");
  std::string schedule_help = "Schedule: ";
  for (const auto& info : pipeline::ScheduleRegistry()) {
    schedule_help += fmt::format("{} ({}), ", info.name, info.summary);
  }
  schedule_help += "or csv:PATH (PyTorch pipelining's compute-only or compute_comms CSV)";
  command->add_option("--schedule", options->schedule, schedule_help)->check(ScheduleName())->capture_default_str();
  command->add_option("--csv", options->csv, "Also write the schedule as PyTorch pipelining's CSV");
  command->add_option("--csv-format", options->csv_format,
                      "compute_only (F, B, I, W) or compute_comms (also each send and receive where pipecheck's "
                      "lowering places them)")
      ->check(CLI::IsMember({"compute_only", "compute_comms"}))->capture_default_str();
  auto* stages = command->add_option("--stages", options->stages, "Pipeline ranks")
                     ->check(CLI::Range(1, 1024))->capture_default_str();
  auto* microbatches = command->add_option("--microbatches", options->microbatches, "Microbatches")
                           ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  auto* virtual_stages = command->add_option("--virtual", options->virtual_stages,
                                             "Stages per rank (default: the schedule's own, 2 for interleaved, zbv "
                                             "and dualpipev, else 1)")
                             ->check(CLI::Range(1, 64));
  command->add_option("--backward-cost", options->backward_cost, "Backward duration relative to forward")
      ->check(FiniteIn(0.01, 100, "a backward/forward cost ratio from 0.01 to 100"))->capture_default_str();
  command->add_flag("--recompute", options->recompute,
                    "Activation recomputation: every B and I runs its stage's forward again first");
  command->add_option("--data-parallel", options->data_parallel,
                      "Replicas of the pipeline: shows each rank's gradient all-reduce after its last backward")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  command->add_option("--accumulation", options->accumulation,
                      "Gradient accumulation: the schedule run this many times per optimizer step, one round after "
                      "another")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  command->add_option("--allreduce-cost", options->allreduce_cost,
                      "The gradient all-reduce's duration relative to a forward (with --data-parallel)")
      ->check(FiniteIn(0.0, 1000, "an all-reduce/forward cost ratio from 0 to 1000"))->capture_default_str();
  return {command, "schedule", [options, virtual_stages, stages, microbatches] {
            harness::ScheduleOptions given = *options;
            given.virtual_given = virtual_stages->count() > 0;
            given.stages_given = stages->count() > 0;
            given.microbatches_given = microbatches->count() > 0;
            if (!WritableFile(given.csv, "schedule", "--csv")) return kExitBadInput;
            return harness::PrintSchedule(given, std::cout);
          }};
}

}  // namespace pipecheck::cli
