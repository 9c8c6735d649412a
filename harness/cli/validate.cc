// `pipecheck validate`: load a suite and report its first error, else every row this machine cannot run.
#include "harness/cli/commands.h"

#include <fmt/format.h>

#include <memory>

#include "harness/scenario_model.h"

namespace pipecheck::cli {

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
              fmt::print("{}", scenarios::ColumnsMarkdown(harness::PipelineVocabulary()));
              return 0;
            }
            const auto suite = harness::LoadSuite(options->scenarios, options->device);
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

}  // namespace pipecheck::cli
