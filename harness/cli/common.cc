// What the subcommands share (see common.h).
#include "harness/cli/common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include "harness/external.h"
#include "harness/run_directory.h"
#include "harness/runnable.h"
#include "harness/scenario_model.h"
#include "reports/csv.h"

namespace pipecheck::cli {

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
    reports::WriteFileAtomically(probe, "");
    std::filesystem::remove(probe);
    return true;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pipecheck {}: --out {} is not writable: {}\n", command, out, error.what());
    return false;
  }
}

namespace {

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

}  // namespace

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
    reports::WriteFileAtomically(probe, "");
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

// A device=cuda scenario on a build or machine without CUDA, said before anything runs.
bool CudaPresentFor(const scenarios::Scenario& scenario, const char* command) {
  if (scenario.device != "cuda" || torch::cuda::is_available()) return true;
  fmt::print(stderr, "pipecheck{}: {}: {}\n", command, scenario.source, harness::RefusalHere(scenario).why);
  return false;
}

// What `run` refuses before any rank starts, said the same way by `validate` and `run --list`:
// a trainer program the suite names that is not there or cannot run is bad input (exit 2);
// else every scenario this machine cannot run, each on its own line (exit 3). 0 when all can run.
int CheckRunnableHere(const std::vector<scenarios::Scenario>& scenarios, const char* command,
                      int* cannot) {
  for (const auto& scenario : scenarios) {
    if (scenario.trainer.rfind("external:", 0) != 0) continue;
    const std::string program = harness::TrainerProblem(scenario);
    if (program.empty()) continue;
    fmt::print(stderr, "pipecheck{}: {}: scenario '{}': {}\n", command, scenario.source, scenario.name, program);
    return kExitBadInput;
  }
  int count = 0;
  for (const auto& scenario : scenarios) {
    const auto not_here = harness::RefusalHere(scenario);
    if (not_here.why.empty()) continue;
    fmt::print(stderr, "pipecheck{}: {}: {}\n", command, not_here.place, not_here.why);
    ++count;
  }
  if (cannot != nullptr) *cannot = count;
  return count == 0 ? 0 : kExitCannotRunHere;
}

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
  if (!gate.runner.empty()) baseline = reports::RunnerBaseline(gate.baseline_dir, gate.runner);
  if (baseline.empty()) return "";
  const std::string summary = reports::SummaryPath(baseline);
  if (!std::filesystem::exists(summary)) {
    throw reports::CompareError(fmt::format(
        "no baseline at {}{}: record one with `pipecheck baseline update --from RUN{}`", summary,
        gate.runner.empty() ? "" : fmt::format(" for runner {}", gate.runner),
        gate.runner.empty() ? " --to DIR" : fmt::format(" --baseline-dir {} --runner {}", gate.baseline_dir,
                                                         gate.runner)));
  }
  reports::ScenariosNotOk(summary);  // readable, a pipecheck summary
  return baseline;
}

// The suite's scenarios that --only selects, each on --device if given; none is bad input.
std::vector<scenarios::Scenario> SelectedScenarios(const std::string& path,
                                                              const std::vector<std::string>& only,
                                                              const std::string& device) {
  const auto suite = harness::LoadSuite(path, device);
  auto selected = scenarios::SelectScenarios(suite, fmt::format("{}", fmt::join(only, ",")), path);
  if (selected.empty()) {
    throw scenarios::ScenarioError(fmt::format("no scenario of {} matches --only '{}'", path,
                                                          fmt::join(only, ",")));
  }
  return selected;
}

}  // namespace pipecheck::cli
