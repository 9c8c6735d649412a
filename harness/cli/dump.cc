// `pipecheck dump`: write the reference's first step as torch.load-able files.
#include "harness/cli/commands.h"

#include <fmt/format.h>

#include <memory>

#include "harness/dump.h"
#include "harness/scenario_model.h"

namespace pipecheck::cli {

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
            const auto suite = harness::LoadSuite(options->scenarios);
            const auto& scenario = scenarios::FindScenario(suite, options->scenario, options->scenarios);
            if (!WritableOut(options->out, "dump")) return kExitBadInput;
            ApplyThreads(options->threads);
            harness::DumpReference(scenario, options->out);
            fmt::print("wrote {}/{{weights,batch,grads,loss}}.pt and scenario.csv for {}\n", options->out,
                       scenario.name);
            return 0;
          }};
}

}  // namespace pipecheck::cli
