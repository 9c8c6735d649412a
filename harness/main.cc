// The `pipecheck` command line: subcommands over the harness library. Exit codes follow
// DESIGN.md §5: 0 all good, 1 something did not meet its expectation, 2 bad input.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>

#include "harness/dump.h"
#include "harness/errors.h"
#include "harness/reference_run.h"
#include "scenarios/scenario.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr const char* kDefaultSuite = "scenarios/core.csv";

struct Options {
  std::string scenarios = kDefaultSuite;
  std::string only;
  std::string scenario;
  std::string out;
  int threads = 0;
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
  } catch (const pipecheck::scenarios::ScenarioError& error) {
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
