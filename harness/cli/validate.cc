// `pipecheck validate`: load a suite and report its first error, else every row this machine cannot run.
#include "harness/cli/commands.h"

#include <fmt/format.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "harness/scenario_model.h"

namespace pipecheck::cli {

namespace {

// A line the loader skips: blank, or a comment (the text as read leaves a comment's '#' first).
bool Skipped(const std::string& line) {
  const auto first = line.find_first_not_of(" \t\r");
  return first == std::string::npos || line[first] == '#';
}

// --each: every row loaded on its own (the header, the row, and blank lines in place of the rest,
// so messages keep the file's line numbers), one verdict a row; then the whole file, for what
// only the whole can break (two rows of one name). A tool that writes candidate rows (a
// pairwise generator) learns from one call which of them the loader takes, and why not.
int ValidateEach(const std::string& path, const std::string& device) {
  const std::string contents = scenarios::ReadSuiteText(path);
  // The lines as the loader reads them (no byte-order mark, CR-only ends made LF).
  std::vector<std::string> lines;
  std::stringstream text_as_read(scenarios::SuiteTextAsRead(contents));
  for (std::string line; std::getline(text_as_read, line);) lines.push_back(line);
  scenarios::Vocabulary vocabulary = harness::PipelineVocabulary();
  vocabulary.device = device;
  size_t header = 0;
  while (header < lines.size() && Skipped(lines[header])) ++header;
  int valid = 0, refused = 0;
  for (size_t row = header + 1; row < lines.size(); ++row) {
    if (Skipped(lines[row])) continue;
    std::string text;
    for (size_t line = 0; line <= row; ++line) text += (line == header || line == row ? lines[line] : "") + "\n";
    try {
      scenarios::ParseScenarios(text, path, vocabulary);
      fmt::print("{}:{}: valid\n", path, row + 1);
      ++valid;
    } catch (const scenarios::ScenarioError& error) {
      fmt::print("{}\n", error.what());
      ++refused;
    }
  }
  fmt::print("{}: {} rows, {} valid, {} refused\n", path, valid + refused, valid, refused);
  if (refused > 0) return kExitBadInput;
  scenarios::ParseScenarios(contents, path, vocabulary);  // the whole: names unique
  return 0;
}

}  // namespace

Command AddValidate(CLI::App& app) {
  struct Options {
    std::string scenarios = kDefaultSuite;
    std::string device;
    bool columns = false;
    bool each = false;
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("validate", "Load a scenario suite and report its first error (exit 2), else "
                                                 "every row this machine cannot run (exit 3)");
  AddScenarios(command, options->scenarios);
  AddDevice(command, options->device, "Check every scenario as if it ran on this device");
  command->add_flag("--columns", options->columns,
                    "Print every scenario column (default, values, meaning) as docs/scenarios.md's Markdown table; "
                    "load nothing");
  command->add_flag("--each", options->each,
                    "Load every row on its own and print one verdict a row (valid, or the loader's error), then "
                    "the whole file; exit 2 when any row is refused. Runnability here is not checked");
  return {command, "validate", [options] {
            if (options->each) return ValidateEach(options->scenarios, options->device);
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
