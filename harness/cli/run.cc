// `pipecheck run`: run scenarios through the pipeline and the reference; write reports.
#include "harness/cli/commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "harness/preflight.h"
#include "harness/run.h"
#include "harness/run_directory.h"
#include "pipeline/trainer.h"

namespace pipecheck::cli {

namespace {

// `run --list`: each selected scenario, what it runs and the memory it needs (pipecheck's own
// trainer; the memory model does not predict another trainer, which the line names instead).
void ListScenarios(const std::vector<scenarios::Scenario>& selected) {
  for (const auto& s : selected) {
    std::string needs;
    if (s.ExternalTrainer()) {
      needs = "trainer " + s.trainer;
    } else {
      double needed = 0;
      for (const auto& need : harness::MemoryNeeds(s)) needed += need.needed;
      needs = "needs at least " + harness::HumanBytes(needed);
    }
    const std::string replicas = s.data_parallel > 1 ? fmt::format(" x data_parallel {}", s.data_parallel) : "";
    fmt::print("{}  world_size {}{} {}{} m={} {} {} {} steps, {}  ({})\n", s.name, s.world_size, replicas,
               s.schedule_written.empty() ? s.schedule : s.schedule_written, s.recompute ? " recompute" : "",
               s.microbatches, s.dtype, s.device, s.steps, needs, s.source);
  }
}

}  // namespace

Command AddRun(CLI::App& app) {
  struct Options {
    std::vector<std::string> only;
    bool list = false;
    GateOptions gate;
    harness::RunOptions run;  // the rest, bound to its flags
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
  run.timed_steps = pipeline::kTimedSamples;
  auto* timed_steps = command->add_option(
      "--timed-steps", run.timed_steps,
      "Steps each scenario of pipecheck's own trainer times for tokens/s and its spread: timing-only steps follow "
      "the judged ones where those time fewer, within 3 s at their pace (0: none). Given, it holds for every row; "
      "else a row's timed_steps column does")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  command->add_flag("--bind-cpus", run.bind_cpus,
                    "Bind each CPU rank to its own contiguous share of this process's CPUs (not with runs side by side)");
  return {command, "run", [options, timed_steps] {
            auto run = options->run;
            run.timed_steps_given = timed_steps->count() > 0;
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
            const harness::RunDirectory directory(run.out, {"views", "work", "compare.csv"});
            run.baseline = baseline;
            run.limits = options->gate.Limits();
            // A run of some rows is compared on the rows it ran: the baseline's others are left out.
            if (!options->only.empty()) {
              for (const auto& scenario : selected) run.limits.ran.push_back(scenario.name);
              run.limits.only_as_given = fmt::format("{}", fmt::join(options->only, ","));
            }
            return harness::RunSuite(selected, run, std::cout);
          }};
}

}  // namespace pipecheck::cli
