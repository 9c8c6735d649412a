// The `pipecheck` command line: subcommands over the harness library. Exit codes follow
// docs/design.md §5: 0 all good, 1 something did not meet its expectation, 2 bad input.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <thread>

#include "harness/dump.h"
#include "harness/errors.h"
#include "harness/invariance.h"
#include "harness/preflight.h"
#include "harness/reference_run.h"
#include "harness/run.h"
#include "harness/run_directory.h"
#include "harness/scenario_model.h"
#include "harness/worker.h"
#include "pipeline/schedule.h"
#include "pipeline/lowering.h"
#include "pipeline/message.h"
#include "pipeline/schedule_csv.h"
#include "pipeline/simulator.h"
#include "reference/host_memory.h"
#include "reports/compare.h"
#include "reports/csv.h"
#include "reports/junit.h"
#include "reports/markdown.h"
#include "scenarios/scenario.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr const char* kDefaultSuite = "scenarios/core.csv";

constexpr const char* kDefaultOut = "reports/latest";

struct Options {
  std::string scenarios = kDefaultSuite;
  std::vector<std::string> only;  // globs; each may hold several, comma-separated
  bool list = false;
  bool microbatched = false;  // reference: accumulate over each scenario's microbatches
  bool bind_cpus = false;  // run: bind CPU ranks to their own cores
  std::string scenario;
  std::string out = kDefaultOut;
  std::string device;
  int threads = 0;
  double timeout = 0.0;
  double rendezvous_timeout = 300.0;  // worker
  // schedule
  std::string schedule = "1f1b";
  int stages = 2;
  int microbatches = 4;
  int virtual_stages = 1;
  std::string schedule_csv;
  double backward_cost = 2.0;
  // compare, and run against a baseline
  std::vector<std::string> compare_paths;  // [BASELINE] CURRENT
  std::string baseline_dir = "reports/baselines";
  std::string runner;
  double noise_factor = 2.0;
  std::string junit;
  std::string markdown;
  double max_slowdown = 0.10;
  double max_memory_growth = 0.10;
  std::string compare_out;  // where compare.csv goes ("" beside the current summary)
  // baseline update
  std::vector<std::string> baseline_from = {kDefaultOut};
  std::string baseline_to;
  bool allow_failures = false;
  // invariance
  bool full = false;
  std::vector<int64_t> world_sizes;
  std::vector<int64_t> more_microbatches;
  bool save_tensors = false;
};

// A finite number in [min, max]: CLI11's own range checks let NaN through and print bounds
// such as DBL_MAX in full.
CLI::Validator FiniteIn(double min, double max, const std::string& allowed) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0.0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc() || ptr != end || !std::isfinite(value) || value < min || value > max) {
          return "value '" + text + "' is not allowed: expected " + allowed;
        }
        return "";
      },
      allowed);
}

// Intra-op threads per process: 0 (automatic) up to the machine's cores; more only
// oversubscribes and turns seconds into timeouts.
CLI::Validator ThreadCount() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return FiniteIn(0, cores, fmt::format("a whole number of threads from 0 (automatic) to {} (this machine's cores)", cores))
      & CLI::Validator(
            [](std::string& text) -> std::string {
              return text.find_first_not_of("0123456789") == std::string::npos ? "" : "expected a whole number";
            },
            "");
}

// An --out directory that can be written, checked before any work: bad input otherwise.
bool WritableOut(const std::string& out, const char* command) {
  if (out.empty()) {
    fmt::print(stderr, "pipecheck {}: --out is empty: name a directory\n", command);
    return false;
  }
  try {
    std::filesystem::create_directories(out);
    const auto probe = (std::filesystem::path(out) / ".pipecheck-write-test").string();
    pipecheck::reports::WriteFileAtomically(probe, "");
    std::filesystem::remove(probe);
    return true;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck {}: --out {} is not writable: {}\n", command, out, error.what());
    return false;
  }
}

// A file a command will write once its work is done (--junit, --markdown, --csv), checked before
// any work: its folder is made if missing, and a file that cannot be written there is bad input
// now, not an exit 1 after the whole suite.
bool WritableFile(const std::string& path, const char* command, const char* option) {
  if (path.empty()) return true;
  try {
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    if (std::filesystem::is_directory(path)) throw std::runtime_error("it is a directory");
    const auto probe = path + ".pipecheck-write-test";
    pipecheck::reports::WriteFileAtomically(probe, "");
    std::filesystem::remove(probe);
    return true;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck {}: {} {} cannot be written: {}\n", command, option, path, error.what());
    return false;
  }
}

void ApplyThreads(int threads) {
  if (threads > 0) {
    at::set_num_threads(threads);
    at::set_num_interop_threads(1);
  }
}

// A device=cuda scenario on a build or machine without CUDA is bad input, said before anything runs.
bool CudaPresentFor(const pipecheck::scenarios::Scenario& scenario, const char* command) {
  if (scenario.device != "cuda" || torch::cuda::is_available()) return true;
  fmt::print(stderr, "pipecheck{}: {}: scenario '{}' needs device cuda, but this build or machine has no CUDA device; "
                     "run it with --device cpu or on a GPU machine\n", command, scenario.source, scenario.name);
  return false;
}

// What `run` refuses before any rank starts, said the same way by `validate` and `run --list`: a
// scenario this build or machine cannot run at all (a CUDA device or an nccl transport it lacks,
// more memory than it has, by the memory model's prediction).
bool RunnableHere(const std::vector<pipecheck::scenarios::Scenario>& scenarios, const char* command) {
  for (const auto& scenario : scenarios) {
    if (!CudaPresentFor(scenario, command)) return false;
    if (scenario.device == "cuda" && scenario.transport == "nccl" && scenario.world_size > 1 &&
        !pipecheck::pipeline::NcclAvailable()) {
      fmt::print(stderr, "pipecheck{}: {}: scenario '{}' asks for transport nccl, but this build has none (its LibTorch "
                         "has no c10d NCCL backend or nccl.h was not found); use staged or auto\n",
                 command, scenario.source, scenario.name);
      return false;
    }
    const std::string memory = pipecheck::harness::MemoryProblem(scenario);
    if (!memory.empty()) {
      fmt::print(stderr, "pipecheck{}: {}: {}\n", command, scenario.source, memory);
      return false;
    }
  }
  return true;
}

int Validate(Options options) {
  auto suite = pipecheck::harness::LoadSuite(options.scenarios);
  if (!options.device.empty()) {
    for (auto& scenario : suite) scenario.device = options.device;
  }
  if (!RunnableHere(suite, " validate")) return kExitBadInput;
  fmt::print("{}: {} scenarios, all valid and runnable here\n", options.scenarios, suite.size());
  return 0;
}

int Reference(const Options& options) {
  const auto suite = pipecheck::harness::LoadSuite(options.scenarios);
  const auto selected = pipecheck::scenarios::SelectScenarios(suite, fmt::format("{}", fmt::join(options.only, ",")),
                                                                options.scenarios);
  if (selected.empty()) {
    fmt::print(stderr, "pipecheck: no scenario of {} matches --only '{}'\n", options.scenarios,
               fmt::join(options.only, ","));
    return kExitBadInput;
  }
  ApplyThreads(options.threads);
  return pipecheck::harness::RunReferenceSuite(selected, options.microbatched, std::cout);
}

// The baseline a command compares with: --baseline-dir/--runner, else the one given; a missing or
// unreadable one is bad input, found before anything runs.
std::string ResolveBaseline(const Options& options, const std::string& given) {
  std::string baseline = given;
  if (!options.runner.empty()) baseline = pipecheck::reports::RunnerBaseline(options.baseline_dir, options.runner);
  if (baseline.empty()) return "";
  const std::string summary = pipecheck::reports::SummaryPath(baseline);
  if (!std::filesystem::exists(summary)) {
    throw pipecheck::reports::CompareError(fmt::format(
        "no baseline at {}{}: record one with `pipecheck baseline update --from RUN{}`", summary,
        options.runner.empty() ? "" : fmt::format(" for runner {}", options.runner),
        options.runner.empty() ? " --to DIR" : fmt::format(" --baseline-dir {} --runner {}", options.baseline_dir,
                                                            options.runner)));
  }
  pipecheck::reports::ScenariosNotOk(summary);  // readable, a pipecheck summary
  return baseline;
}

int Run(Options options) {
  auto suite = pipecheck::harness::LoadSuite(options.scenarios);
  auto selected = pipecheck::scenarios::SelectScenarios(suite, fmt::format("{}", fmt::join(options.only, ",")),
                                                                options.scenarios);
  if (selected.empty()) {
    fmt::print(stderr, "pipecheck: no scenario of {} matches --only '{}'\n", options.scenarios,
               fmt::join(options.only, ","));
    return kExitBadInput;
  }
  if (!options.device.empty()) {
    for (auto& scenario : selected) scenario.device = options.device;
  }
  // A scenario this build or machine cannot run at all is bad input, found before anything runs.
  if (!RunnableHere(selected, options.list ? " run --list" : " run")) return kExitBadInput;
  if (options.list) {
    for (const auto& s : selected) {
      int64_t needed = 0;
      for (const auto& need : pipecheck::harness::MemoryNeeds(s)) needed += need.needed;
      fmt::print("{}  world_size {} {} m={} {} {} {} steps, needs at least {}  ({})\n", s.name, s.world_size,
                 s.schedule_written.empty() ? s.schedule : s.schedule_written, s.microbatches, s.dtype, s.device,
                 s.steps, pipecheck::harness::HumanBytes(static_cast<double>(needed)), s.source);
    }
    return 0;
  }
  // An unwritable --out, --junit or --markdown, or a missing baseline, is bad input, found before
  // anything runs; so is an --out another run is writing into.
  if (!WritableOut(options.out, "run") || !WritableFile(options.junit, "run", "--junit") ||
      !WritableFile(options.markdown, "run", "--markdown")) {
    return kExitBadInput;
  }
  const pipecheck::harness::RunDirectory directory(options.out, {"views", "work", "compare.csv"});
  pipecheck::harness::RunOptions run;
  run.baseline = ResolveBaseline(options, "");
  run.limits = {options.max_slowdown, options.max_memory_growth, options.noise_factor};
  run.junit = options.junit;
  run.markdown = options.markdown;
  run.scenarios_path = options.scenarios;
  run.out = options.out;
  run.timeout_seconds = options.timeout;
  run.threads_per_rank = options.threads;
  run.device = options.device;
  run.bind_cpus = options.bind_cpus;
  return pipecheck::harness::RunSuite(selected, run, std::cout);
}

int Worker(const Options& options) {
  pipecheck::harness::WorkerOptions worker;
  worker.scenarios_path = options.scenarios;
  worker.scenario = options.scenario;
  worker.out = options.out;
  worker.threads = options.threads;
  worker.device = options.device;
  worker.save_tensors = options.save_tensors;
  worker.rendezvous_timeout_seconds = options.rendezvous_timeout;
  return pipecheck::harness::RunWorker(worker);
}

int Invariance(const Options& options) {
  const auto suite = pipecheck::harness::LoadSuite(options.scenarios);
  auto scenario = pipecheck::scenarios::FindScenario(suite, options.scenario, options.scenarios);
  if (!options.device.empty()) scenario.device = options.device;
  if (!CudaPresentFor(scenario, " invariance")) return kExitBadInput;
  if (!WritableOut(options.out, "invariance")) return kExitBadInput;
  const pipecheck::harness::RunDirectory directory(options.out, {});
  ApplyThreads(options.threads);  // the reference, computed here, with the ranks' thread count
  pipecheck::harness::InvarianceOptions invariance;
  invariance.scenarios_path = options.scenarios;
  invariance.out = options.out;
  invariance.full = options.full;
  invariance.world_sizes = options.world_sizes;
  invariance.microbatches = options.more_microbatches;
  invariance.threads = options.threads;
  invariance.timeout_seconds = options.timeout;
  return pipecheck::harness::RunInvariance(scenario, invariance, std::cout);
}

int PrintSchedule(const Options& options) {
  using namespace pipecheck::pipeline;
  if (!WritableFile(options.schedule_csv, "schedule", "--csv")) return kExitBadInput;
  const PipelineShape shape{options.stages, options.virtual_stages, options.microbatches};
  const Schedule compute = ScheduleByName(options.schedule, shape);
  // Said first: lowering and simulating thousands of actions per rank takes seconds.
  fmt::print("schedule {}: {} ranks, {} microbatches ({} stages)\n\n", options.schedule, shape.ranks,
             shape.microbatches, shape.stages());
  std::fflush(stdout);
  const Schedule lowered = LowerSchedule(compute);
  CostModel equal;
  CostModel weighted;
  weighted.backward = options.backward_cost;
  weighted.backward_input = weighted.backward_weight = options.backward_cost / 2;  // a split B costs what B does
  const auto result = ValidateSchedule(lowered, weighted, CommunicationModel::kDeviceStreams);
  const auto equal_result = ValidateSchedule(lowered, equal, CommunicationModel::kDeviceStreams);
  const auto streams = Simulate(lowered, SendSemantics::kDeviceStreams, weighted);
  fmt::print("actions per rank (communication included):\n{}\n", FormatActions(lowered));
  fmt::print("timeline with F=1, B={} (one column per time unit):\n{}\n", options.backward_cost,
             FormatTimeline(lowered, result, weighted));
  std::vector<int> peaks = result.peak_in_flight;
  fmt::print("bubble: {:.4f} with F=1, B={}; {:.4f} with equal costs (1F1B's (p-1)/(m+p-1) = {:.4f})\n", result.bubble,
             options.backward_cost, equal_result.bubble,
             static_cast<double>(shape.ranks - 1) / (shape.microbatches + shape.ranks - 1));
  fmt::print("peak in-flight microbatches per rank: {}\n", fmt::join(peaks, " "));
  std::string formula;
  if (const auto published = PublishedMakespan(compute.name, compute.shape, weighted, &formula)) {
    const double busy = std::accumulate(result.busy.begin(), result.busy.end(), 0.0);
    fmt::print("makespan with F=1, B={}: {:g} simulated; published for {}: {} (bubble {:.4f})\n", options.backward_cost,
               result.makespan, compute.name, formula, 1.0 - busy / (shape.ranks * *published));
  }
  fmt::print("valid on every transport: gloo and staged (messages wait on the host: makespan {:g} with F=1, B={}), "
             "nccl (on device streams, one channel per ordered pair of ranks: makespan {:g})\n",
             result.makespan, options.backward_cost, streams.makespan);
  if (!options.schedule_csv.empty()) {
    pipecheck::reports::WriteFileAtomically(options.schedule_csv, ScheduleToCsv(compute));
    fmt::print("wrote {} (PyTorch pipelining's compute-only CSV)\n", options.schedule_csv);
  }
  return 0;
}

int Compare(const Options& options) {
  using namespace pipecheck::reports;
  if (options.compare_paths.size() != (options.runner.empty() ? 2u : 1u)) {
    fmt::print(stderr, "pipecheck compare: {}\n",
               options.runner.empty() ? "expected BASELINE and CURRENT (or --runner NAME and CURRENT)"
                                      : "with --runner, give only CURRENT: the baseline is --baseline-dir/NAME");
    return kExitBadInput;
  }
  const std::string current = options.compare_paths.back();
  const std::string baseline = ResolveBaseline(options, options.runner.empty() ? options.compare_paths[0] : "");
  // compare.csv goes to --out, else beside the current summary; unwritable is bad input, found first.
  const std::string out_directory =
      options.compare_out.empty() ? std::filesystem::path(SummaryPath(current)).parent_path().string()
                                  : options.compare_out;
  if (!WritableOut(out_directory.empty() ? "." : out_directory, "compare") ||
      !WritableFile(options.junit, "compare", "--junit") || !WritableFile(options.markdown, "compare", "--markdown")) {
    return kExitBadInput;
  }
  const CompareOptions limits{options.max_slowdown, options.max_memory_growth, options.noise_factor};
  const Comparison comparison = CompareSummaries(baseline, current, limits);
  fmt::print("{}", FormatComparison(comparison, limits));
  const auto out = std::filesystem::path(out_directory.empty() ? "." : out_directory) / "compare.csv";
  WriteFileAtomically(out.string(), ComparisonCsv(comparison));
  fmt::print("wrote {}\n", out.string());
  if (!options.junit.empty()) {
    std::vector<JUnitCase> cases;
    for (const auto& row : comparison.rows) cases.push_back(CompareCase(row, baseline));
    WriteFileAtomically(options.junit, JUnitXml("pipecheck compare " + baseline, cases));
    fmt::print("wrote {}\n", options.junit);
  }
  if (!options.markdown.empty()) {
    const bool appended = WriteMarkdown(options.markdown, CompareMarkdown(comparison, baseline, current));
    fmt::print("{} {}\n", appended ? "appended to" : "wrote", options.markdown);
  }
  return comparison.regressions == 0 ? 0 : 1;
}

int UpdateBaseline(const Options& options) {
  const std::string to = options.runner.empty() ? options.baseline_to
                                                : pipecheck::reports::RunnerBaseline(options.baseline_dir, options.runner);
  if (to.empty()) {
    fmt::print(stderr, "pipecheck baseline update: name the baseline: --to DIR, or --runner NAME [--baseline-dir DIR]\n");
    return kExitBadInput;
  }
  if (!WritableOut(to, "baseline update")) return kExitBadInput;
  const auto written = pipecheck::reports::PromoteToBaseline(options.baseline_from, to, options.allow_failures);
  fmt::print("baseline {} now holds {} {}: {}\n", to, options.baseline_from.size() == 1 ? "the run of" : "the runs of",
             fmt::join(options.baseline_from, ", "), fmt::join(written, ", "));
  if (options.baseline_from.size() > 1) {
    fmt::print("merged: per scenario the median tokens/s of the {} runs and their spread, which `compare` allows "
               "for\n", options.baseline_from.size());
  }
  const auto ungated = pipecheck::reports::ScenariosWithoutSpread(to);
  if (!ungated.empty()) {
    fmt::print(stderr, "warning: {} of the baseline's scenarios recorded no tokens/s spread ({}): one run with too few "
                       "timed steps says nothing of this runner's noise, so `compare` will not gate their throughput "
                       "(only status and memory); record the baseline from three runs: baseline update --from R1 "
                       "--from R2 --from R3\n",
               ungated.size(), fmt::join(ungated, ", "));
  }
  return 0;
}

int Dump(const Options& options) {
  const auto suite = pipecheck::harness::LoadSuite(options.scenarios);
  const auto& scenario = pipecheck::scenarios::FindScenario(suite, options.scenario, options.scenarios);
  if (!WritableOut(options.out, "dump")) return kExitBadInput;
  ApplyThreads(options.threads);
  pipecheck::harness::DumpReference(scenario, options.out);
  fmt::print("wrote {}/{{weights,batch,grads,loss}}.pt and scenario.csv for {}\n", options.out, scenario.name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pipecheck::reference::KeepFreedHostMemory();  // before anything is allocated: every command may train and time
  CLI::App app{"pipecheck: verifies a pipeline-parallel trainer against a single-device reference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("pipecheck {} (LibTorch {}.{}.{}, CUDA devices: {})", PIPECHECK_VERSION,
                                                  TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH,
                                                  torch::cuda::device_count()));
  Options options;

  auto* validate = app.add_subcommand("validate", "Load a scenario suite and report the first error, or the first "
                                                  "row this machine cannot run (exit 2)");
  validate->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  validate->add_option("--device", options.device, "Check every scenario as if it ran on this device")
      ->check(CLI::IsMember({"cpu", "cuda"}));

  auto* reference = app.add_subcommand("reference", "Train the reference on each scenario: losses, step time");
  reference->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  reference->add_option("--only", options.only, "Shell globs on scenario names (repeat, or separate with commas)")
      ->take_all();
  reference->add_option("--threads", options.threads, "Intra-op threads (0: LibTorch's default)")
      ->check(ThreadCount());
  reference->add_flag("--microbatched", options.microbatched,
                      "Accumulate over each scenario's microbatches, one after another on one device (world size "
                      "1's arithmetic): what the microbatch size costs, without a pipeline");

  auto* dump = app.add_subcommand("dump", "Write the reference's first step as torch.load-able files");
  dump->add_option("--scenario", options.scenario, "Scenario name")->required();
  dump->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  dump->add_option("--out", options.out, "Output directory")->required();
  dump->add_option("--threads", options.threads, "Intra-op threads (0: LibTorch's default)")
      ->check(ThreadCount());

  auto* run = app.add_subcommand("run", "Run scenarios through the pipeline and the reference; write reports");
  run->add_option("--junit", options.junit, "Also write JUnit XML: a testcase per scenario");
  run->add_option("--markdown", options.markdown,
                  "Also write a Markdown summary (appended when FILE is $GITHUB_STEP_SUMMARY)");
  run->add_option("--baseline-dir", options.baseline_dir, "Where the runners' baselines live")->capture_default_str();
  run->add_option("--runner", options.runner,
                  "Compare the run with --baseline-dir/RUNNER (this runner's baseline); a regression fails the run");
  run->add_option("--max-slowdown", options.max_slowdown, "With --runner: tolerated loss of tokens/s, as a fraction")
      ->check(FiniteIn(0.0, 1.0, "a fraction from 0 to 1"))->capture_default_str();
  run->add_option("--max-memory-growth", options.max_memory_growth,
                  "With --runner: tolerated growth of peak bytes, as a fraction")
      ->check(FiniteIn(0.0, 100.0, "a fraction from 0 to 100"))->capture_default_str();
  run->add_option("--noise-factor", options.noise_factor,
                  "With --runner: tokens/s may fall by this many times the baseline's recorded spread")
      ->check(FiniteIn(0.0, 100.0, "a factor from 0 to 100"))->capture_default_str();
  run->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  run->add_option("--only", options.only, "Shell globs on scenario names (repeat, or separate with commas)")
      ->take_all();
  run->add_option("--out", options.out, "Report directory (default reports/latest)");
  run->add_flag("--list", options.list, "List the selected scenarios and exit; nothing runs");
  run->add_option("--device", options.device, "Override every scenario's device")->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_option("--timeout", options.timeout,
                  "Deadline per scenario in seconds (default: sized to each scenario, 30 s and up)")
      ->check(FiniteIn(0.001, 86400, "seconds from 0.001 to 86400 (a day)"));
  run->add_option("--threads", options.threads, "Intra-op threads per rank (0: cores / world_size)")
      ->check(ThreadCount());
  run->add_flag("--bind-cpus", options.bind_cpus,
                "Bind each CPU rank to its own contiguous share of this process's CPUs (not with runs side by side)");

  auto* worker = app.add_subcommand("worker", "One rank of one scenario (environment: RANK, WORLD_SIZE, "
                                              "MASTER_ADDR, MASTER_PORT, as torchrun and SLURM set them)");
  worker->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  worker->add_option("--scenario", options.scenario, "Scenario name")->required();
  worker->add_option("--out", options.out, "Where rank 0 writes the reports (default reports/latest)");
  worker->add_option("--device", options.device, "Override the scenario's device")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  worker->add_option("--threads", options.threads, "Intra-op threads (0: LibTorch's default)")
      ->check(ThreadCount());

  worker->add_option("--rendezvous-timeout", options.rendezvous_timeout,
                     "Seconds to wait for the other ranks to rendezvous; then exit 2 naming what was missing")
      ->check(FiniteIn(1, 86400, "seconds from 1 to 86400 (a day)"))->capture_default_str();
  worker->add_flag("--save-tensors", options.save_tensors,
                   "Rank 0 also writes tensors.pt: every step's loss and applied gradients, the final weights");

  auto* invariance = app.add_subcommand(
      "invariance", "Run one scenario across world sizes, partitions and schedules; compare every pair, bitwise "
                    "where the arithmetic is the same (float64, CPU)");
  invariance->add_option("--scenario", options.scenario, "Scenario name")->required();
  invariance->add_option("--scenarios", options.scenarios, "Scenario CSV file")->capture_default_str();
  invariance->add_option("--out", options.out, "Output directory (default reports/invariance)");
  invariance->add_flag("--full", options.full,
                       "Every world size x schedule x partition (default: one axis at a time from the scenario)");
  invariance->add_option("--world-sizes", options.world_sizes, "World sizes to try (default 1 up to max(4, the "
                                                                "scenario's))")
      ->delimiter(',')->check(CLI::Range(1, 64));
  invariance->add_option("--microbatches", options.more_microbatches,
                         "Further microbatch counts to try (each changes the arithmetic)")
      ->delimiter(',')->check(CLI::Range(1, 65535));
  invariance->add_option("--device", options.device, "Override the scenario's device")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  invariance->add_option("--threads", options.threads, "Intra-op threads per rank, the same in every variant")
      ->check(ThreadCount())->default_val(1)->capture_default_str();
  invariance->add_option("--timeout", options.timeout, "Deadline per variant in seconds (default: sized to each)")
      ->check(FiniteIn(0.001, 86400, "seconds from 0.001 to 86400 (a day)"));

  auto* schedule = app.add_subcommand("schedule", "Print a schedule's per-rank actions, timeline and bubble");
  std::string schedule_help = "Schedule: ";
  for (const auto& info : pipecheck::pipeline::ScheduleRegistry()) {
    schedule_help += fmt::format("{} ({}), ", info.name, info.summary);
  }
  schedule_help += "or csv:PATH (PyTorch pipelining's compute-only CSV)";
  schedule->add_option("--schedule", options.schedule, schedule_help)
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const auto& names = pipecheck::pipeline::ScheduleNames();
            if (value.rfind("csv:", 0) == 0 && value.size() > 4) return "";
            if (std::find(names.begin(), names.end(), value) != names.end()) return "";
            return fmt::format("{} is not a schedule: expected one of {} or csv:PATH", value, fmt::join(names, ", "));
          },
          "SCHEDULE"))
      ->capture_default_str();
  schedule->add_option("--csv", options.schedule_csv, "Also write the schedule as PyTorch pipelining's compute-only CSV");
  schedule->add_option("--stages", options.stages, "Pipeline ranks")->check(CLI::Range(1, 1024))->capture_default_str();
  schedule->add_option("--microbatches", options.microbatches, "Microbatches")->check(CLI::Range(1, 65535))
      ->capture_default_str();
  schedule->add_option("--virtual", options.virtual_stages, "Stages per rank (default: the schedule's own, 2 for "
                                                            "interleaved and zbv, else 1)")->check(CLI::Range(1, 64));
  schedule->add_option("--backward-cost", options.backward_cost, "Backward duration relative to forward")
      ->check(FiniteIn(0.01, 100, "a backward/forward cost ratio from 0.01 to 100"))->capture_default_str();

  auto* compare = app.add_subcommand("compare", "Compare a run's summary.csv with a baseline's; exit 1 on regression");
  compare->add_option("BASELINE CURRENT", options.compare_paths,
                      "Baseline and current summary.csv, or their directories (with --runner: CURRENT only)")
      ->required()->expected(1, 2);
  compare->add_option("--baseline-dir", options.baseline_dir, "Where the runners' baselines live")
      ->capture_default_str();
  compare->add_option("--runner", options.runner, "Compare with --baseline-dir/RUNNER, this runner's baseline");
  compare->add_option("--noise-factor", options.noise_factor,
                      "Tokens/s may fall by this many times the spread the baseline recorded, if more than "
                      "--max-slowdown")
      ->check(FiniteIn(0.0, 100.0, "a factor from 0 to 100"))->capture_default_str();
  compare->add_option("--junit", options.junit, "Also write JUnit XML: a testcase per scenario, a failure per regression");
  compare->add_option("--markdown", options.markdown,
                      "Also write a Markdown summary (appended when FILE is $GITHUB_STEP_SUMMARY)");
  compare->add_option("--max-slowdown", options.max_slowdown, "Tolerated loss of tokens/s, as a fraction")
      ->check(FiniteIn(0.0, 1.0, "a fraction from 0 to 1"))->capture_default_str();
  compare->add_option("--out", options.compare_out, "Directory for compare.csv (default: the current summary's)");
  compare->add_option("--max-memory-growth", options.max_memory_growth, "Tolerated growth of peak bytes, as a fraction")
      ->check(FiniteIn(0.0, 100.0, "a fraction from 0 to 100"))->capture_default_str();

  auto* baseline = app.add_subcommand("baseline", "Manage committed baselines");
  baseline->require_subcommand(1);
  auto* baseline_update =
      baseline->add_subcommand("update", "Promote a reviewed run's reports to a baseline directory");
  baseline_update->add_option("--from", options.baseline_from,
                              "The run's report directory or summary.csv; repeat for several runs of the suite, merged "
                              "with their spread (noise-aware compare)")
      ->capture_default_str();
  auto* to = baseline_update->add_option("--to", options.baseline_to, "Baseline directory, e.g. reports/baselines/RUNNER");
  baseline_update->add_option("--baseline-dir", options.baseline_dir, "Where the runners' baselines live (with --runner)")
      ->capture_default_str();
  auto* runner = baseline_update->add_option("--runner", options.runner, "Promote to --baseline-dir/RUNNER");
  to->excludes(runner);
  baseline_update->add_flag("--allow-failures", options.allow_failures,
                            "Promote even if some scenarios did not meet their expectation");

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
    if (invariance->parsed()) {
      if (invariance->count("--out") == 0) options.out = "reports/invariance";
      return Invariance(options);
    }
    if (schedule->parsed()) {
      // Without --virtual, the schedule's own default: interleaved and zbv run two stages per rank.
      const auto* info = pipecheck::pipeline::FindSchedule(options.schedule);
      if (schedule->count("--virtual") == 0 && info) options.virtual_stages = info->default_virtual_stages;
      return PrintSchedule(options);
    }
    if (compare->parsed()) return Compare(options);
    if (baseline_update->parsed()) return UpdateBaseline(options);
  } catch (const pipecheck::scenarios::ScenarioError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
    return kExitBadInput;
  } catch (const pipecheck::reports::CompareError& error) {
    fmt::print(stderr, "pipecheck {}: {}\n", run->parsed() ? "run" : (compare->parsed() ? "compare" : "baseline update"),
               error.what());
    return kExitBadInput;
  } catch (const pipecheck::harness::RunDirectoryError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
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
