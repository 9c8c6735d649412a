// `pipecheck compare`: compare a run's summary with a baseline's.
#include "harness/cli/commands.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "reports/csv.h"
#include "reports/junit.h"
#include "reports/markdown.h"

namespace pipecheck::cli {

namespace {

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

}  // namespace

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

}  // namespace pipecheck::cli
