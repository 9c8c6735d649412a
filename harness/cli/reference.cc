// `pipecheck reference`: train the reference alone on each scenario: losses, step time, phases.
#include "harness/cli/commands.h"

#include <iostream>
#include <memory>

#include "harness/reference_run.h"

namespace pipecheck::cli {

Command AddReference(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::vector<std::string> only;
    int threads = 0;
    harness::ReferenceRunOptions run;
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
            return harness::RunReferenceSuite(selected, options->run, std::cout);
          }};
}

}  // namespace pipecheck::cli
