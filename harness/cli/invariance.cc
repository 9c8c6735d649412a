// `pipecheck invariance`: one scenario under its variants: what must not change the result.
#include "harness/cli/commands.h"

#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "harness/invariance.h"
#include "harness/run_directory.h"
#include "harness/scenario_model.h"

namespace pipecheck::cli {

Command AddInvariance(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::string scenario;
    std::string out = "reports/invariance";
    std::string device;
    harness::InvarianceOptions invariance;
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
            const auto suite = harness::LoadSuite(options->scenarios, options->device);
            auto scenario = scenarios::FindScenario(suite, options->scenario, options->scenarios);
            if (!CudaPresentFor(scenario, " invariance")) return kExitCannotRunHere;
            if (scenario.ExternalTrainer()) {
              // The matrix is of pipecheck's own pipelines: its variants are its schedules and
              // partitions, and its bitwise pairs come from what its ranks record.
              fmt::print(stderr, "pipecheck invariance: {}: scenario '{}' is trained by trainer {}; invariance varies "
                                 "pipecheck's own trainer (run it with `pipecheck run`)\n",
                         scenario.source, scenario.name, scenario.trainer);
              return kExitBadInput;
            }
            if (!scenario.resumes.empty()) {
              fmt::print(stderr, "pipecheck invariance: {}: scenario '{}' stops and resumes ({}); invariance varies "
                                 "one straight run's layout: take a row without `resume`\n",
                         scenario.source, scenario.name, scenario.resume);
              return kExitBadInput;
            }
            if (!WritableOut(options->out, "invariance")) return kExitBadInput;
            const harness::RunDirectory directory(options->out, {});
            ApplyThreads(options->invariance.threads);  // the reference, computed here, with the ranks' count
            auto invariance = options->invariance;
            invariance.scenarios_path = options->scenarios;
            invariance.out = options->out;
            return harness::RunInvariance(scenario, invariance, std::cout);
          }};
}

}  // namespace pipecheck::cli
