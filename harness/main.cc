// The `pipecheck` command line: subcommands over the harness library. Exit codes follow
// DESIGN.md §5: 0 all good, 1 something did not meet its expectation, 2 bad input.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>

#include "harness/dump.h"
#include "harness/errors.h"
#include "harness/reference_run.h"
#include "harness/run.h"
#include "harness/worker.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "reports/compare.h"
#include "reports/csv.h"
#include "scenarios/scenario.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr const char* kDefaultSuite = "scenarios/core.csv";

constexpr const char* kDefaultOut = "reports/latest";

struct Options {
  std::string scenarios = kDefaultSuite;
  std::string only;
  std::string scenario;
  std::string out;
  std::string device;
  int threads = 0;
  double timeout = 0.0;
  // schedule
  std::string schedule = "1f1b";
  int stages = 2;
  int microbatches = 4;
  int virtual_stages = 1;
  double backward_cost = 2.0;
  // compare
  std::string baseline;
  std::string current;
  double max_slowdown = 0.10;
  double max_memory_growth = 0.10;
};

void ApplyThreads(int threads) {
  if (threads > 0) {
    at::set_num_threads(threads);
    at::set_num_interop_threads(1);
  }
}

int Validate(const Options& options) {
  const auto suite = pipecheck::scenarios::LoadScenarios(options.scenarios);
  fmt::print("{}: {} scenarios, all valid\n", options.scenarios, suite.size());
  return 0;
}

int Reference(const Options& options) {
  const auto suite = pipecheck::scenarios::LoadScenarios(options.scenarios);
  const auto selected = pipecheck::scenarios::SelectScenarios(suite, options.only);
  if (selected.empty()) {
    fmt::print(stderr, "pipecheck: no scenario of {} matches --only '{}'\n", options.scenarios, options.only);
    return kExitBadInput;
  }
  ApplyThreads(options.threads);
  return pipecheck::harness::RunReferenceSuite(selected, std::cout);
}

int Run(Options options) {
  auto suite = pipecheck::scenarios::LoadScenarios(options.scenarios);
  auto selected = pipecheck::scenarios::SelectScenarios(suite, options.only);
  if (selected.empty()) {
    fmt::print(stderr, "pipecheck: no scenario of {} matches --only '{}'\n", options.scenarios, options.only);
    return kExitBadInput;
  }
  if (!options.device.empty()) {
    for (auto& scenario : selected) scenario.device = options.device;
  }
  if (options.out.empty()) options.out = kDefaultOut;
  std::filesystem::create_directories(options.out);
  // An unwritable --out is bad input, found before anything runs.
  const auto probe = (std::filesystem::path(options.out) / ".pipecheck-write-test").string();
  try {
    pipecheck::reports::WriteFileAtomically(probe, "");
  } catch (const std::runtime_error& error) {
    fmt::print(stderr, "pipecheck: --out {} is not writable: {}\n", options.out, error.what());
    return kExitBadInput;
  }
  std::filesystem::remove(probe);
  pipecheck::harness::RunOptions run;
  run.scenarios_path = options.scenarios;
  run.out = options.out;
  run.timeout_seconds = options.timeout;
  run.threads_per_rank = options.threads;
  return pipecheck::harness::RunSuite(selected, run, std::cout);
}

int Worker(const Options& options) {
  pipecheck::harness::WorkerOptions worker;
  worker.scenarios_path = options.scenarios;
  worker.scenario = options.scenario;
  worker.out = options.out.empty() ? kDefaultOut : options.out;
  worker.threads = options.threads;
  return pipecheck::harness::RunWorker(worker);
}

int PrintSchedule(const Options& options) {
  using namespace pipecheck::pipeline;
  const PipelineShape shape{options.stages, options.virtual_stages, options.microbatches};
  const Schedule lowered = AddCommunication(MakeSchedule(options.schedule, shape));
  CostModel equal;
  CostModel weighted;
  weighted.backward = options.backward_cost;
  const auto result = ValidateSchedule(lowered, weighted);
  const auto equal_result = ValidateSchedule(lowered, equal);
  fmt::print("schedule {}: {} ranks, {} microbatches ({} stages)\n\n", options.schedule, shape.ranks,
             shape.microbatches, shape.stages());
  fmt::print("actions per rank (communication included):\n{}\n", FormatActions(lowered));
  fmt::print("timeline with F=1, B={} (one column per time unit):\n{}\n", options.backward_cost,
             FormatTimeline(lowered, result, weighted));
  std::vector<int> peaks = result.peak_in_flight;
  fmt::print("bubble: {:.4f} with F=1, B={}; {:.4f} with equal costs ((p-1)/(m+p-1) = {:.4f})\n", result.bubble,
             options.backward_cost, equal_result.bubble,
             static_cast<double>(shape.ranks - 1) / (shape.microbatches + shape.ranks - 1));
  fmt::print("peak in-flight microbatches per rank: {}\n", fmt::join(peaks, " "));
  return 0;
}

int Compare(const Options& options) {
  using namespace pipecheck::reports;
  const Comparison comparison = CompareSummaries(options.baseline, options.current,
                                                 {options.max_slowdown, options.max_memory_growth});
  fmt::print("{:<28} {:<10} {:>8} {:>8} {:>10} {:>10}  {}\n", "scenario", "verdict", "baseline", "current",
             "tokens/s", "memory", "notes");
  CsvTable table(ComparisonColumns());
  for (const auto& row : comparison.rows) {
    fmt::print("{:<28} {:<10} {:>8} {:>8} {:>10} {:>10}  {}\n", row.scenario, row.verdict, row.baseline_status,
               row.current_status, row.throughput_change, row.memory_change, row.notes);
    table.AddRow(ComparisonFields(row));
  }
  const auto out = std::filesystem::path(SummaryPath(options.current)).parent_path() / "compare.csv";
  WriteFileAtomically(out.string(), table.ToString());
  fmt::print("\n{} scenarios compared: {} regression(s), {} warning(s) (limits: tokens/s -{:.0f}%, memory +{:.0f}%)\n"
             "wrote {}\n",
             comparison.rows.size(), comparison.regressions, comparison.warnings, 100 * options.max_slowdown,
             100 * options.max_memory_growth, out.string());
  return comparison.regressions == 0 ? 0 : 1;
}

int Dump(const Options& options) {
  const auto suite = pipecheck::scenarios::LoadScenarios(options.scenarios);
  const auto& scenario = pipecheck::scenarios::FindScenario(suite, options.scenario, options.scenarios);
  ApplyThreads(options.threads);
  pipecheck::harness::DumpReference(scenario, options.out);
  fmt::print("wrote {}/{{weights,batch,grads,loss}}.pt and scenario.csv for {}\n", options.out, scenario.name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipecheck: verifies a pipeline-parallel trainer against a single-device reference"};
  app.require_subcommand(1);
  Options options;

  auto* validate = app.add_subcommand("validate", "Load a scenario suite and report the first error (exit 2)");
  validate->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();

  auto* reference = app.add_subcommand("reference", "Train the reference on each scenario: losses, step time");
  reference->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  reference->add_option("--only", options.only, "Shell glob on scenario names");
  reference->add_option("--threads", options.threads, "Intra-op threads (0: LibTorch's default)")
      ->check(CLI::NonNegativeNumber);

  auto* dump = app.add_subcommand("dump", "Write the reference's first step as torch.load-able files");
  dump->add_option("--scenario", options.scenario, "Scenario name")->required();
  dump->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  dump->add_option("--out", options.out, "Output directory")->required();
  dump->add_option("--threads", options.threads, "Intra-op threads (0: LibTorch's default)")
      ->check(CLI::NonNegativeNumber);

  auto* run = app.add_subcommand("run", "Run scenarios through the pipeline and the reference; write reports");
  run->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  run->add_option("--only", options.only, "Shell glob on scenario names");
  run->add_option("--out", options.out, "Report directory (default reports/latest)");
  run->add_option("--device", options.device, "Override every scenario's device")->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_option("--timeout", options.timeout,
                  "Deadline per scenario in seconds (default: sized to each scenario, 30 s and up)")
      ->check(CLI::PositiveNumber);
  run->add_option("--threads", options.threads, "Intra-op threads per rank (0: cores / world_size)")
      ->check(CLI::NonNegativeNumber);

  auto* worker = app.add_subcommand("worker", "One rank of one scenario (environment: RANK, WORLD_SIZE, "
                                              "MASTER_ADDR, MASTER_PORT, as torchrun and SLURM set them)");
  worker->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  worker->add_option("--scenario", options.scenario, "Scenario name")->required();
  worker->add_option("--out", options.out, "Where rank 0 writes the reports (default reports/latest)");
  worker->add_option("--threads", options.threads, "Intra-op threads (0: LibTorch's default)")
      ->check(CLI::NonNegativeNumber);

  auto* schedule = app.add_subcommand("schedule", "Print a schedule's per-rank actions, timeline and bubble");
  schedule->add_option("--schedule", options.schedule, "Schedule name")
      ->check(CLI::IsMember(pipecheck::pipeline::ScheduleNames()))->capture_default_str();
  schedule->add_option("--stages", options.stages, "Pipeline ranks")->check(CLI::Range(1, 1024))->capture_default_str();
  schedule->add_option("--microbatches", options.microbatches, "Microbatches")->check(CLI::Range(1, 65535))
      ->capture_default_str();
  schedule->add_option("--virtual", options.virtual_stages, "Stages per rank")->check(CLI::Range(1, 64))
      ->capture_default_str();
  schedule->add_option("--backward-cost", options.backward_cost, "Backward duration relative to forward")
      ->check(CLI::PositiveNumber)->capture_default_str();

  auto* compare = app.add_subcommand("compare", "Compare a run's summary.csv with a baseline's; exit 1 on regression");
  compare->add_option("BASELINE", options.baseline, "Baseline summary.csv or its directory")->required();
  compare->add_option("CURRENT", options.current, "Current summary.csv or its directory")->required();
  compare->add_option("--max-slowdown", options.max_slowdown, "Tolerated loss of tokens/s, as a fraction")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  compare->add_option("--max-memory-growth", options.max_memory_growth, "Tolerated growth of peak bytes, as a fraction")
      ->check(CLI::NonNegativeNumber)->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitBadInput;
  }

  try {
    if (validate->parsed()) return Validate(options);
    if (reference->parsed()) return Reference(options);
    if (dump->parsed()) return Dump(options);
    if (run->parsed()) return Run(options);
    if (worker->parsed()) return Worker(options);
    if (schedule->parsed()) return PrintSchedule(options);
    if (compare->parsed()) return Compare(options);
  } catch (const pipecheck::scenarios::ScenarioError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
    return kExitBadInput;
  } catch (const pipecheck::reports::CompareError& error) {
    fmt::print(stderr, "pipecheck compare: {}\n", error.what());
    return kExitBadInput;
  } catch (const pipecheck::pipeline::ScheduleError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
    return kExitBadInput;
  } catch (const std::filesystem::filesystem_error& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck: {}\n", pipecheck::harness::ErrorMessage(error));
    return 1;
  }
  return kExitBadInput;
}
