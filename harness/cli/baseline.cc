// `pipecheck baseline update`: promote runs to a runner's baseline (baseline update).
#include "harness/cli/commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>

namespace pipecheck::cli {

namespace {

struct BaselineUpdateOptions {
  std::vector<std::string> from = {kDefaultOut};
  std::string to;
  std::string baseline_dir = "reports/baselines";
  std::string runner;
  bool allow_failures = false;
};

int UpdateBaseline(const BaselineUpdateOptions& options) {
  const std::string to = options.runner.empty() ? options.to
                                                : reports::RunnerBaseline(options.baseline_dir, options.runner);
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
  const auto written = reports::PromoteToBaseline(options.from, to, options.allow_failures);
  fmt::print("baseline {} now holds {} {}: {}\n", to, options.from.size() == 1 ? "the run of" : "the runs of",
             fmt::join(options.from, ", "), fmt::join(written, ", "));
  if (options.from.size() > 1) {
    fmt::print("merged: per scenario the fastest of the {} runs' tokens/s and their spread, which `compare` "
               "allows for\n", options.from.size());
  }
  const auto ungated = reports::ScenariosWithoutSpread(to);
  if (!ungated.empty()) {
    fmt::print(stderr, "warning: {} of the baseline's scenarios recorded no tokens/s spread ({}): one run with too few "
                       "timed steps says nothing of this runner's noise, so `compare` will not gate their throughput "
                       "(only status and memory); record the baseline from three runs: baseline update --from R1 "
                       "--from R2 --from R3\n",
               ungated.size(), fmt::join(ungated, ", "));
  }
  return 0;
}

}  // namespace

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

}  // namespace pipecheck::cli
