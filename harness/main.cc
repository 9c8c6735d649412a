// The `pipecheck` command line: subcommands over the harness library. Exit codes follow
// docs/design.md §5: 0 all good, 1 something did not meet its expectation, 2 bad input.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include "harness/dump.h"
#include "harness/external.h"
#include "harness/errors.h"
#include "harness/invariance.h"
#include "harness/preflight.h"
#include "harness/reference_run.h"
#include "harness/run.h"
#include "harness/run_directory.h"
#include "harness/scenario_model.h"
#include "harness/schedule_command.h"
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
// A well-formed suite with a row this build or machine cannot run (no CUDA device or nccl, too
// little memory): not the suite's fault, so CI can tell it from a typo.
constexpr int kExitCannotRunHere = 3;
constexpr const char* kDefaultSuite = "scenarios/core.csv";

constexpr const char* kDefaultOut = "reports/latest";

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
// A whole number from min to max, one message for every way it is not ("abc", "", "1.5", "99"):
// "value 'TEXT' is not allowed: expected ALLOWED".
CLI::Validator WholeIn(int64_t min, int64_t max, const std::string& allowed) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
          return "value '" + text + "' is not allowed: expected " + allowed;
        }
        return "";
      },
      allowed);
}

// A comma-separated list of whole numbers from min to max into `values`; an empty entry ("1,,2")
// or a bad one is refused naming it (CLI11's own splitting drops empty entries silently).
CLI::Option* AddWholeList(CLI::App* command, const std::string& name, std::vector<int64_t>& values, int64_t min,
                          int64_t max, const std::string& what, const std::string& help) {
  const auto check = WholeIn(min, max, fmt::format("a whole number of {} from {} to {}", what, min, max));
  return command->add_option_function<std::string>(
      name,
      [&values, check, name](const std::string& text) {
        values.clear();
        std::stringstream stream(text);
        std::string entry;
        size_t index = 0;
        while (std::getline(stream, entry, ',')) {
          ++index;
          if (entry.empty()) {
            throw CLI::ValidationError(name, fmt::format("entry {} of '{}' is empty", index, text));
          }
          const std::string problem = check(entry);
          if (!problem.empty()) throw CLI::ValidationError(name, problem);
          values.push_back(std::stoll(entry));
        }
        if (values.empty() || text.back() == ',') {
          throw CLI::ValidationError(name, fmt::format("entry {} of '{}' is empty", index + 1, text));
        }
      },
      help);
}

// One check, one message (two validators joined by & print both failures).
CLI::Validator ThreadCount() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return WholeIn(0, cores, fmt::format("a whole number of threads from 0 (automatic) to {} (this machine's cores)",
                                       cores));
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

// `path` as an absolute, normal path without a trailing separator, symbolic links resolved as far
// as it exists.
std::filesystem::path Resolved(const std::string& path) {
  std::error_code error;
  auto resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(path), error);
  if (error) resolved = std::filesystem::absolute(path);
  resolved = resolved.lexically_normal();
  if (resolved.filename().empty() && resolved.has_parent_path()) resolved = resolved.parent_path();
  return resolved;
}

// Whether `inner` is `outer` or lies inside it.
bool Within(const std::string& inner, const std::string& outer) {
  if (inner.empty() || outer.empty()) return false;
  const auto a = Resolved(inner), b = Resolved(outer);
  return std::mismatch(b.begin(), b.end(), a.begin(), a.end()).first == b.end();
}

// A command that would write into `out` where baselines live (`baseline_dir`, or `baseline`, the
// one it reads), or over them (`out` holding one), would destroy what it is held to: refused
// before anything is written, naming both. `what` names the option ("--out").
bool WritesOverABaseline(const std::string& out, const std::string& baseline_dir, const std::string& baseline,
                         const char* command, const char* what) {
  for (const auto& [protected_path, kind] : {std::pair{baseline_dir, "the baselines' directory (--baseline-dir)"},
                                             std::pair{baseline, "the baseline it compares with"}}) {
    if (protected_path.empty()) continue;
    const auto kept = std::filesystem::path(protected_path);
    const std::string folder = kept.filename() == "summary.csv" ? kept.parent_path().string() : protected_path;
    std::error_code error;
    if (!std::filesystem::is_directory(folder, error)) continue;  // nothing there to destroy
    if (Within(out, folder) || Within(folder, out)) {
      fmt::print(stderr,
                 "pipecheck {}: {} {} would write {} {} {}: a run written there replaces the baseline it is "
                 "held to; write it elsewhere and promote it with `pipecheck baseline update`\n",
                 command, what, out, Within(out, folder) ? "inside" : "over", kind, folder);
      return true;
    }
  }
  return false;
}

// A file a command will write once its work is done (--junit, --markdown, --csv), checked before
// any work: its folder is made if missing, and a file that cannot be written there is bad input
// now, not an exit 1 after the whole suite.
bool WritableFile(const std::string& path, const char* command, const char* option) {
  if (path.empty()) return true;
  try {
    // The file's own folder is made when missing (a run's --out is, and CI files often go there);
    // a path missing more than that is a typo, not a place to build.
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty() && !std::filesystem::exists(parent)) {
      const auto grandparent = std::filesystem::absolute(parent).parent_path();
      if (!std::filesystem::is_directory(grandparent)) {
        throw std::runtime_error(fmt::format("no directory {} to make its folder {} in", grandparent.string(),
                                             parent.string()));
      }
      std::filesystem::create_directory(parent);
    }
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

// Why this build or machine cannot run a well-formed scenario at all (a CUDA device or an nccl
// transport it lacks, more memory than it has, by the memory model's prediction), and where the
// message points (the row, or the column behind a memory refusal); no reason if it can.
struct NotHere {
  std::string place, why;
};
NotHere WhyNotHere(const pipecheck::scenarios::Scenario& scenario) {
  if (scenario.device == "cuda" && !torch::cuda::is_available()) {
    return {scenario.source, fmt::format("scenario '{}' needs device cuda, but this build or machine has no CUDA "
                                         "device; run it with --device cpu or on a GPU machine", scenario.name)};
  }
  if (scenario.device == "cuda" && scenario.transport == "nccl" && scenario.world_size > 1 &&
      !pipecheck::pipeline::NcclAvailable()) {
    return {scenario.source, fmt::format("scenario '{}' asks for transport nccl, but this build has none (its LibTorch "
                                         "has no c10d NCCL backend or nccl.h was not found); use staged or auto",
                                         scenario.name)};
  }
  const std::string trainer = pipecheck::harness::TrainerProblem(scenario);
  if (!trainer.empty()) return {scenario.source, fmt::format("scenario '{}': {}", scenario.name, trainer)};
  // The memory model predicts pipecheck's own trainer; another trainer's memory is its own.
  if (scenario.ExternalTrainer()) return {};
  const auto memory = pipecheck::harness::MemoryRefusalOf(scenario);
  return {memory.place, memory.why};
}

// A device=cuda scenario on a build or machine without CUDA, said before anything runs.
bool CudaPresentFor(const pipecheck::scenarios::Scenario& scenario, const char* command) {
  if (scenario.device != "cuda" || torch::cuda::is_available()) return true;
  fmt::print(stderr, "pipecheck{}: {}: {}\n", command, scenario.source, WhyNotHere(scenario).why);
  return false;
}

// What `run` refuses before any rank starts, said the same way by `validate` and `run --list`:
// a trainer program the suite names that is not there or cannot run is bad input (exit 2);
// else every scenario this machine cannot run, each on its own line (exit 3). 0 when all can run.
int CheckRunnableHere(const std::vector<pipecheck::scenarios::Scenario>& scenarios, const char* command,
                      int* cannot = nullptr) {
  for (const auto& scenario : scenarios) {
    if (scenario.trainer.rfind("external:", 0) != 0) continue;
    const std::string program = pipecheck::harness::TrainerProblem(scenario);
    if (program.empty()) continue;
    fmt::print(stderr, "pipecheck{}: {}: scenario '{}': {}\n", command, scenario.source, scenario.name, program);
    return kExitBadInput;
  }
  int count = 0;
  for (const auto& scenario : scenarios) {
    const auto not_here = WhyNotHere(scenario);
    if (not_here.why.empty()) continue;
    fmt::print(stderr, "pipecheck{}: {}: {}\n", command, not_here.place, not_here.why);
    ++count;
  }
  if (cannot != nullptr) *cannot = count;
  return count == 0 ? 0 : kExitCannotRunHere;
}

// ---- Option groups several subcommands share.

CLI::Option* AddScenarios(CLI::App* command, std::string& scenarios) {
  return command->add_option("--scenarios", scenarios, "Scenario CSV file")->capture_default_str();
}

void AddOnly(CLI::App* command, std::vector<std::string>& only) {
  command->add_option("--only", only, "Shell globs on scenario names (repeat, or separate with commas)")->take_all();
}

void AddThreads(CLI::App* command, int& threads, const char* help) {
  command->add_option("--threads", threads, help)->check(ThreadCount());
}

CLI::Option* AddDevice(CLI::App* command, std::string& device, const char* help) {
  return command->add_option("--device", device, help)->check(CLI::IsMember({"cpu", "cuda"}));
}

void AddTimeout(CLI::App* command, double& timeout, const char* help) {
  command->add_option("--timeout", timeout, help)->check(FiniteIn(0.001, 86400, "seconds from 0.001 to 86400 (a day)"));
}

// Which baseline a run or comparison is held to, and how far it may fall behind.
struct GateOptions {
  std::string baseline_dir = "reports/baselines";
  std::string runner;
  double max_slowdown = 0.10;
  double max_memory_growth = 0.10;
  double noise_factor = pipecheck::reports::CompareOptions{}.noise_factor;

  pipecheck::reports::CompareOptions Limits() const {
    pipecheck::reports::CompareOptions limits;
    limits.max_slowdown = max_slowdown;
    limits.max_memory_growth = max_memory_growth;
    limits.noise_factor = noise_factor;
    return limits;
  }
};

// With `optional` (run), the limits apply only with --runner, and their help says so.
void AddGate(CLI::App* command, GateOptions& gate, const std::string& runner_help, bool optional) {
  const auto help = [optional](std::string text) {
    if (!optional) text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    return optional ? "With --runner: " + text : text;
  };
  command->add_option("--baseline-dir", gate.baseline_dir, "Where the runners' baselines live")->capture_default_str();
  command->add_option("--runner", gate.runner, runner_help);
  command->add_option("--max-slowdown", gate.max_slowdown, help("tolerated loss of tokens/s, as a fraction"))
      ->check(FiniteIn(0.0, 1.0, "a fraction from 0 to 1"))->capture_default_str();
  command->add_option("--max-memory-growth", gate.max_memory_growth,
                      help("tolerated growth of peak bytes, as a fraction"))
      ->check(FiniteIn(0.0, 100.0, "a fraction from 0 to 100"))->capture_default_str();
  command->add_option("--noise-factor", gate.noise_factor,
                      help("tokens/s may fall by this many times the spread the baseline recorded, if more than "
                           "--max-slowdown, but at most 20% (or --max-slowdown, if more)"))
      ->check(FiniteIn(0.0, 100.0, "a factor from 0 to 100"))->capture_default_str();
}

// The CI files a command may also write: JUnit XML and a Markdown summary.
void AddCiFiles(CLI::App* command, std::string& junit, std::string& markdown, const char* junit_help) {
  command->add_option("--junit", junit, junit_help);
  command->add_option("--markdown", markdown,
                      "Also write a Markdown summary (appended when FILE is $GITHUB_STEP_SUMMARY)");
}

bool CiFilesWritable(const std::string& junit, const std::string& markdown, const char* command) {
  return WritableFile(junit, command, "--junit") && WritableFile(markdown, command, "--markdown");
}

// The baseline a command compares with: --baseline-dir/--runner, else the one given; a missing or
// unreadable one is bad input, found before anything runs.
std::string ResolveBaseline(const GateOptions& gate, const std::string& given) {
  std::string baseline = given;
  if (!gate.runner.empty()) baseline = pipecheck::reports::RunnerBaseline(gate.baseline_dir, gate.runner);
  if (baseline.empty()) return "";
  const std::string summary = pipecheck::reports::SummaryPath(baseline);
  if (!std::filesystem::exists(summary)) {
    throw pipecheck::reports::CompareError(fmt::format(
        "no baseline at {}{}: record one with `pipecheck baseline update --from RUN{}`", summary,
        gate.runner.empty() ? "" : fmt::format(" for runner {}", gate.runner),
        gate.runner.empty() ? " --to DIR" : fmt::format(" --baseline-dir {} --runner {}", gate.baseline_dir,
                                                         gate.runner)));
  }
  pipecheck::reports::ScenariosNotOk(summary);  // readable, a pipecheck summary
  return baseline;
}

// The suite's scenarios that --only selects, each on --device if given; none is bad input.
std::vector<pipecheck::scenarios::Scenario> SelectedScenarios(const std::string& path,
                                                              const std::vector<std::string>& only,
                                                              const std::string& device) {
  const auto suite = pipecheck::harness::LoadSuite(path, device);
  auto selected = pipecheck::scenarios::SelectScenarios(suite, fmt::format("{}", fmt::join(only, ",")), path);
  if (selected.empty()) {
    throw pipecheck::scenarios::ScenarioError(fmt::format("no scenario of {} matches --only '{}'", path,
                                                          fmt::join(only, ",")));
  }
  return selected;
}

// One subcommand: its parser, what it is called in messages, and what runs when it is parsed.
struct Command {
  CLI::App* app = nullptr;
  std::string label;
  std::function<int()> run;
};

// ---- The subcommands, each its options, its registration and its body.

Command AddValidate(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::string device;
    bool columns = false;
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("validate", "Load a scenario suite and report its first error (exit 2), else "
                                                 "every row this machine cannot run (exit 3)");
  AddScenarios(command, options->scenarios);
  AddDevice(command, options->device, "Check every scenario as if it ran on this device");
  command->add_flag("--columns", options->columns,
                    "Print every scenario column (default, values, meaning) as docs/scenarios.md's Markdown table; "
                    "load nothing");
  return {command, "validate", [options] {
            if (options->columns) {
              fmt::print("{}", pipecheck::scenarios::ColumnsMarkdown(pipecheck::harness::PipelineVocabulary()));
              return 0;
            }
            const auto suite = pipecheck::harness::LoadSuite(options->scenarios, options->device);
            int cannot = 0;
            if (const int code = CheckRunnableHere(suite, " validate", &cannot)) {
              if (code == kExitCannotRunHere) {
                fmt::print("{}: {} scenarios, all well formed; {} cannot run here\n", options->scenarios, suite.size(),
                           cannot);
              }
              return code;
            }
            fmt::print("{}: {} scenarios, all valid and runnable here\n", options->scenarios, suite.size());
            return 0;
          }};
}

Command AddReference(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::vector<std::string> only;
    int threads = 0;
    pipecheck::harness::ReferenceRunOptions run;
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("reference", "Train the reference on each scenario: losses, step time");
  AddScenarios(command, options->scenarios);
  AddOnly(command, options->only);
  AddThreads(command, options->threads, "Intra-op threads (0: LibTorch's default)");
  command->add_flag("--microbatched", options->run.microbatched,
                    "Accumulate over each scenario's microbatches, one after another on one device (world size "
                    "1's arithmetic): what the microbatch size costs, without a pipeline");
  command->add_flag("--phases", options->run.phases,
                    "Also print each scenario's step split by phase (data, forward, loss, backward, accumulate, "
                    "grad norm, optimizer, ...), the device synchronised at each phase's end");
  return {command, "reference", [options] {
            const auto selected = SelectedScenarios(options->scenarios, options->only, "");
            ApplyThreads(options->threads);
            return pipecheck::harness::RunReferenceSuite(selected, options->run, std::cout);
          }};
}

Command AddDump(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::string scenario;
    std::string out;
    int threads = 0;
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("dump", "Write the reference's first step as torch.load-able files");
  command->add_option("--scenario", options->scenario, "Scenario name")->required();
  AddScenarios(command, options->scenarios);
  command->add_option("--out", options->out, "Output directory")->required();
  AddThreads(command, options->threads, "Intra-op threads (0: LibTorch's default)");
  return {command, "dump", [options] {
            const auto suite = pipecheck::harness::LoadSuite(options->scenarios);
            const auto& scenario = pipecheck::scenarios::FindScenario(suite, options->scenario, options->scenarios);
            if (!WritableOut(options->out, "dump")) return kExitBadInput;
            ApplyThreads(options->threads);
            pipecheck::harness::DumpReference(scenario, options->out);
            fmt::print("wrote {}/{{weights,batch,grads,loss}}.pt and scenario.csv for {}\n", options->out,
                       scenario.name);
            return 0;
          }};
}

// `run --list`: each selected scenario, what it runs and the memory it needs (pipecheck's own
// trainer; the memory model does not predict another trainer, which the line names instead).
void ListScenarios(const std::vector<pipecheck::scenarios::Scenario>& selected) {
  for (const auto& s : selected) {
    std::string needs;
    if (s.ExternalTrainer()) {
      needs = "trainer " + s.trainer;
    } else {
      double needed = 0;
      for (const auto& need : pipecheck::harness::MemoryNeeds(s)) needed += need.needed;
      needs = "needs at least " + pipecheck::harness::HumanBytes(needed);
    }
    const std::string replicas = s.data_parallel > 1 ? fmt::format(" x data_parallel {}", s.data_parallel) : "";
    fmt::print("{}  world_size {}{} {}{} m={} {} {} {} steps, {}  ({})\n", s.name, s.world_size, replicas,
               s.schedule_written.empty() ? s.schedule : s.schedule_written, s.recompute ? " recompute" : "",
               s.microbatches, s.dtype, s.device, s.steps, needs, s.source);
  }
}

Command AddRun(CLI::App& app) {
  struct Options {
    std::vector<std::string> only;
    bool list = false;
    GateOptions gate;
    pipecheck::harness::RunOptions run;  // the rest, bound to its flags
  };
  auto options = std::make_shared<Options>();
  auto& run = options->run;
  run.scenarios_path = kDefaultSuite;
  run.out = kDefaultOut;
  auto* command = app.add_subcommand("run", "Run scenarios through the pipeline and the reference; write reports");
  AddCiFiles(command, run.junit, run.markdown, "Also write JUnit XML: a testcase per scenario");
  AddGate(command, options->gate,
          "Compare the run with --baseline-dir/RUNNER (this runner's baseline); a regression fails the run",
          /*optional=*/true);
  AddScenarios(command, run.scenarios_path);
  AddOnly(command, options->only);
  command->add_option("--out", run.out, "Report directory (default reports/latest)");
  command->add_flag("--list", options->list, "List the selected scenarios and exit; nothing runs");
  AddDevice(command, run.device, "Override every scenario's device");
  AddTimeout(command, run.timeout_seconds,
             "Deadline per scenario in seconds (default: sized to each scenario, 30 s and up); past it a "
             "scenario still making progress runs on, up to 10 times it");
  AddThreads(command, run.threads_per_rank, "Intra-op threads per rank (0: cores / world_size)");
  run.timed_steps = pipecheck::pipeline::kTimedSamples;
  command->add_option("--timed-steps", run.timed_steps,
                      "Steps each scenario of pipecheck's own trainer times for tokens/s and its spread: timing-only "
                      "steps follow the judged ones where those time fewer, within 3 s at their pace (0: none)")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  command->add_flag("--bind-cpus", run.bind_cpus,
                    "Bind each CPU rank to its own contiguous share of this process's CPUs (not with runs side by side)");
  return {command, "run", [options] {
            auto run = options->run;
            const auto selected = SelectedScenarios(run.scenarios_path, options->only, run.device);
            // A scenario this build or machine cannot run at all is bad input, found before anything runs.
            if (const int code = CheckRunnableHere(selected, options->list ? " run --list" : " run")) return code;
            if (options->list) {
              ListScenarios(selected);
              return 0;
            }
            // An unwritable --out, --junit or --markdown, or a missing baseline, is bad input, found
            // before anything runs; so is an --out another run is writing into.
            // So is an --out inside the baselines (or holding them): it would replace what it is held to.
            const std::string baseline = ResolveBaseline(options->gate, "");
            if (WritesOverABaseline(run.out, options->gate.baseline_dir, baseline, "run", "--out")) return kExitBadInput;
            if (!WritableOut(run.out, "run") || !CiFilesWritable(run.junit, run.markdown, "run")) return kExitBadInput;
            const pipecheck::harness::RunDirectory directory(run.out, {"views", "work", "compare.csv"});
            run.baseline = baseline;
            run.limits = options->gate.Limits();
            // A run of some rows is compared on the rows it ran: the baseline's others are left out.
            if (!options->only.empty()) {
              for (const auto& scenario : selected) run.limits.ran.push_back(scenario.name);
              run.limits.only_as_given = fmt::format("{}", fmt::join(options->only, ","));
            }
            return pipecheck::harness::RunSuite(selected, run, std::cout);
          }};
}

Command AddWorker(CLI::App& app) {
  auto options = std::make_shared<pipecheck::harness::WorkerOptions>();
  options->scenarios_path = kDefaultSuite;
  options->out = kDefaultOut;
  auto* command = app.add_subcommand("worker", "One rank of one scenario (environment: RANK, WORLD_SIZE, "
                                               "MASTER_ADDR, MASTER_PORT, as torchrun and SLURM set them)");
  auto* scenarios = AddScenarios(command, options->scenarios_path);
  auto* plan = command->add_option("--plan", options->plan,
                                   "The scenario's plan, as `pipecheck run` writes it (work/NAME/plan.json): "
                                   "nothing is loaded or resolved again");
  auto* scenario = command->add_option("--scenario", options->scenario, "Scenario name (without --plan)");
  command->add_option("--out", options->out, "Where rank 0 writes the reports (default reports/latest)");
  auto* device = AddDevice(command, options->device, "Override the scenario's device (without --plan)");
  // A plan holds the scenario, its suite's path and its device already: naming them again is a mistake.
  for (auto* given : {scenario, scenarios, device}) plan->excludes(given);
  AddThreads(command, options->threads, "Intra-op threads (0: LibTorch's default)");
  command->add_option("--rendezvous-timeout", options->rendezvous_timeout_seconds,
                      "Seconds to wait for the other ranks to rendezvous; then exit 2 naming what was missing")
      ->check(FiniteIn(1, 86400, "seconds from 1 to 86400 (a day)"))->capture_default_str();
  command->add_flag("--save-tensors", options->save_tensors,
                    "Rank 0 also writes tensors.pt: every step's loss and applied gradients, the final weights");
  options->timed_steps = pipecheck::pipeline::kTimedSamples;
  command->add_option("--timed-steps", options->timed_steps,
                      "Steps to time for tokens/s and its spread: timing-only steps follow the judged ones where "
                      "those time fewer (bounded in time; 0: none)")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  command->add_option("--phase", options->phase,
                      "For another trainer under test (trainer=torch, torchtitan, deepspeed, megatron, external:PATH; one process, no rendezvous): "
                      "'prepare' writes its inputs into --out's exchange folder, 'judge' judges what it handed back")
      ->check(CLI::IsMember({"prepare", "judge"}));
  return {command, "worker", [options] { return pipecheck::harness::RunWorker(*options); }};
}

Command AddInvariance(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::string scenario;
    std::string out = "reports/invariance";
    std::string device;
    pipecheck::harness::InvarianceOptions invariance;
  };
  auto options = std::make_shared<Options>();
  options->invariance.threads = 1;
  auto& invariance = options->invariance;
  auto* command = app.add_subcommand(
      "invariance", "Run one scenario across world sizes, partitions and schedules; compare every pair, bitwise "
                    "where the arithmetic is the same (float64, CPU)");
  command->add_option("--scenario", options->scenario, "Scenario name")->required();
  AddScenarios(command, options->scenarios);
  command->add_option("--out", options->out, "Output directory (default reports/invariance)");
  command->add_flag("--full", invariance.full,
                    "Every world size x schedule x partition (default: one axis at a time from the scenario)");
  AddWholeList(command, "--world-sizes", invariance.world_sizes, 1, 64, "ranks",
               "World sizes to try, comma-separated (default 1 up to max(4, the scenario's))");
  AddWholeList(command, "--microbatches", invariance.microbatches, 1, 65535, "microbatches",
               "Further microbatch counts to try, comma-separated (each changes the arithmetic)");
  AddWholeList(command, "--data-parallel", invariance.data_parallel, 1, 64, "replicas",
               "Replica counts to try, comma-separated (default 1,2; each count changes the order of the gradient sum)");
  AddDevice(command, options->device, "Override the scenario's device");
  command->add_option("--threads", invariance.threads, "Intra-op threads per rank, the same in every variant")
      ->check(ThreadCount())->capture_default_str();
  AddTimeout(command, invariance.timeout_seconds, "Deadline per variant in seconds (default: sized to each)");
  return {command, "invariance", [options] {
            const auto suite = pipecheck::harness::LoadSuite(options->scenarios, options->device);
            auto scenario = pipecheck::scenarios::FindScenario(suite, options->scenario, options->scenarios);
            if (!CudaPresentFor(scenario, " invariance")) return kExitCannotRunHere;
            if (scenario.ExternalTrainer()) {
              // The matrix is of pipecheck's own pipelines: its variants are its schedules and
              // partitions, and its bitwise pairs come from what its ranks record.
              fmt::print(stderr, "pipecheck invariance: {}: scenario '{}' is trained by trainer {}; invariance varies "
                                 "pipecheck's own trainer (run it with `pipecheck run`)\n",
                         scenario.source, scenario.name, scenario.trainer);
              return kExitBadInput;
            }
            if (!WritableOut(options->out, "invariance")) return kExitBadInput;
            const pipecheck::harness::RunDirectory directory(options->out, {});
            ApplyThreads(options->invariance.threads);  // the reference, computed here, with the ranks' count
            auto invariance = options->invariance;
            invariance.scenarios_path = options->scenarios;
            invariance.out = options->out;
            return pipecheck::harness::RunInvariance(scenario, invariance, std::cout);
          }};
}

// --schedule: a registry name or csv:PATH.
CLI::Validator ScheduleName() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const auto& names = pipecheck::pipeline::ScheduleNames();
        if (value.rfind("csv:", 0) == 0 && value.size() > 4) return "";
        if (std::find(names.begin(), names.end(), value) != names.end()) return "";
        return fmt::format("{} is not a schedule: expected one of {} or csv:PATH", value, fmt::join(names, ", "));
      },
      "SCHEDULE");
}

Command AddSchedule(CLI::App& app) {
  auto options = std::make_shared<pipecheck::harness::ScheduleOptions>();
  auto* command = app.add_subcommand("schedule", "Print a schedule's per-rank actions, timeline and bubble");
  std::string schedule_help = "Schedule: ";
  for (const auto& info : pipecheck::pipeline::ScheduleRegistry()) {
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
            pipecheck::harness::ScheduleOptions given = *options;
            given.virtual_given = virtual_stages->count() > 0;
            given.stages_given = stages->count() > 0;
            given.microbatches_given = microbatches->count() > 0;
            if (!WritableFile(given.csv, "schedule", "--csv")) return kExitBadInput;
            return pipecheck::harness::PrintSchedule(given, std::cout);
          }};
}

struct CompareCommandOptions {
  std::vector<std::string> paths;  // [BASELINE] CURRENT
  GateOptions gate;
  std::string junit, markdown;
  std::string out;  // where compare.csv goes ("" beside the current summary)
  std::string only;  // --only globs, comma-separated: compare only these rows
};

int Compare(const CompareCommandOptions& options) {
  using namespace pipecheck::reports;
  if (options.paths.size() != (options.gate.runner.empty() ? 2u : 1u)) {
    fmt::print(stderr, "pipecheck compare: {}\n",
               options.gate.runner.empty() ? "expected BASELINE and CURRENT (or --runner NAME and CURRENT)"
                                           : "with --runner, give only CURRENT: the baseline is --baseline-dir/NAME");
    return kExitBadInput;
  }
  const std::string current = options.paths.back();
  const std::string baseline = ResolveBaseline(options.gate, options.gate.runner.empty() ? options.paths[0] : "");
  // compare.csv goes to --out, else beside the current summary; unwritable is bad input, found first.
  std::string out_directory =
      options.out.empty() ? std::filesystem::path(SummaryPath(current)).parent_path().string() : options.out;
  if (out_directory.empty()) out_directory = ".";
  if (!options.out.empty() &&
      WritesOverABaseline(options.out, options.gate.runner.empty() ? "" : options.gate.baseline_dir, baseline,
                          "compare", "--out")) {
    return kExitBadInput;
  }
  if (!WritableOut(out_directory, "compare") || !CiFilesWritable(options.junit, options.markdown, "compare")) {
    return kExitBadInput;
  }
  CompareOptions limits = options.gate.Limits();
  limits.only = options.only;
  const Comparison comparison = CompareSummaries(baseline, current, limits);
  fmt::print("{}", FormatComparison(comparison, limits));
  const auto out = std::filesystem::path(out_directory) / "compare.csv";
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

Command AddCompare(CLI::App& app) {
  auto options = std::make_shared<CompareCommandOptions>();
  auto* command = app.add_subcommand("compare", "Compare a run's summary.csv with a baseline's; exit 1 on regression");
  command->add_option("BASELINE CURRENT", options->paths,
                      "Baseline and current summary.csv, or their directories (with --runner: CURRENT only)")
      ->required()->expected(1, 2);
  AddGate(command, options->gate, "Compare with --baseline-dir/RUNNER, this runner's baseline", /*optional=*/false);
  AddCiFiles(command, options->junit, options->markdown,
             "Also write JUnit XML: a testcase per scenario, a failure per regression");
  command->add_option("--out", options->out, "Directory for compare.csv (default: the current summary's)");
  // One comma-separated list: a list option would take BASELINE and CURRENT after it as globs.
  command->add_option("--only", options->only,
                      "Compare only the scenarios these shell globs name (separate with commas); the baseline's "
                      "others are left out, not missing");
  return {command, "compare", [options] { return Compare(*options); }};
}

struct BaselineUpdateOptions {
  std::vector<std::string> from = {kDefaultOut};
  std::string to;
  std::string baseline_dir = "reports/baselines";
  std::string runner;
  bool allow_failures = false;
};

int UpdateBaseline(const BaselineUpdateOptions& options) {
  const std::string to = options.runner.empty() ? options.to
                                                : pipecheck::reports::RunnerBaseline(options.baseline_dir, options.runner);
  if (to.empty()) {
    fmt::print(stderr, "pipecheck baseline update: name the baseline: --to DIR, or --runner NAME [--baseline-dir DIR]\n");
    return kExitBadInput;
  }
  for (const auto& from : options.from) {
    const auto run = std::filesystem::path(from).filename() == "summary.csv" ? std::filesystem::path(from).parent_path().string()
                                                                             : from;
    if (Within(run, to) || Within(to, run)) {
      fmt::print(stderr, "pipecheck baseline update: --from {} and the baseline {} are one folder or nested: a "
                         "baseline is promoted from a run written elsewhere\n", from, to);
      return kExitBadInput;
    }
  }
  if (!WritableOut(to, "baseline update")) return kExitBadInput;
  const auto written = pipecheck::reports::PromoteToBaseline(options.from, to, options.allow_failures);
  fmt::print("baseline {} now holds {} {}: {}\n", to, options.from.size() == 1 ? "the run of" : "the runs of",
             fmt::join(options.from, ", "), fmt::join(written, ", "));
  if (options.from.size() > 1) {
    fmt::print("merged: per scenario the median tokens/s of the {} runs and their spread, which `compare` allows "
               "for\n", options.from.size());
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

Command AddBaselineUpdate(CLI::App& app) {
  auto options = std::make_shared<BaselineUpdateOptions>();
  auto* baseline = app.add_subcommand("baseline", "Manage committed baselines");
  baseline->require_subcommand(1);
  auto* command = baseline->add_subcommand("update", "Promote a reviewed run's reports to a baseline directory");
  command->add_option("--from", options->from,
                      "The run's report directory or summary.csv; repeat for several runs of the suite, merged "
                      "with their spread (noise-aware compare)")
      ->capture_default_str();
  auto* to = command->add_option("--to", options->to, "Baseline directory, e.g. reports/baselines/RUNNER");
  command->add_option("--baseline-dir", options->baseline_dir, "Where the runners' baselines live (with --runner)")
      ->capture_default_str();
  auto* runner = command->add_option("--runner", options->runner, "Promote to --baseline-dir/RUNNER");
  to->excludes(runner);
  command->add_flag("--allow-failures", options->allow_failures,
                    "Promote even if some scenarios did not meet their expectation");
  return {command, "baseline update", [options] { return UpdateBaseline(*options); }};
}

// Runs `command`, turning what it throws into the exit codes of docs/design.md §5.
int RunCommand(const Command& command) {
  try {
    return command.run();
  } catch (const pipecheck::scenarios::ScenarioError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const pipecheck::reports::CompareError& error) {
    fmt::print(stderr, "pipecheck {}: {}\n", command.label, error.what());
  } catch (const pipecheck::harness::RunDirectoryError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const pipecheck::pipeline::ScheduleError& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const std::filesystem::filesystem_error& error) {
    fmt::print(stderr, "pipecheck: {}\n", error.what());
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck: {}\n", pipecheck::harness::ErrorMessage(error));
    return 1;
  }
  return kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  pipecheck::reference::KeepFreedHostMemory();  // before anything is allocated: every command may train and time
  CLI::App app{"pipecheck: verifies a pipeline-parallel trainer against a single-device reference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("pipecheck {} (LibTorch {}.{}.{}, CUDA devices: {})", PIPECHECK_VERSION,
                                                  TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH,
                                                  torch::cuda::device_count()));
  const std::vector<Command> commands = {AddValidate(app),   AddReference(app), AddDump(app),
                                         AddRun(app),        AddWorker(app),    AddInvariance(app),
                                         AddSchedule(app),   AddCompare(app),   AddBaselineUpdate(app)};
  // A word that names no command is a typo to name, not a missing subcommand.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      fmt::print(stderr, "pipecheck: unknown command '{}'; the commands are {} (pipecheck --help)\n", argv[1],
                 fmt::join(names, ", "));
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitBadInput;
  }
  for (const auto& command : commands) {
    if (command.app->parsed()) return RunCommand(command);
  }
  return kExitBadInput;
}
