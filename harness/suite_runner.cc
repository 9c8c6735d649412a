// The suite runner (see suite_runner.h).
#include "harness/suite_runner.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "harness/errors.h"
#include "harness/parity.h"
#include "harness/plan.h"

namespace pipecheck::harness {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The plan's report: launched, or SKIPPED with why this host cannot run it.
reports::ScenarioReport PlanAndLaunch(const scenarios::Scenario& scenario, SuiteRunOptions& options) {
  if (!scenario.resumes.empty()) {
    return LaunchResumed(scenario, options.launch, options.timeout_seconds, options.threads_per_rank);
  }
  const Plan plan = ResolvePlan(scenario);
  options.launch.timeout_seconds = options.timeout_seconds > 0 ? options.timeout_seconds : plan.deadline_seconds;
  if (!plan.unmet.empty()) {
    return FailedScenarioReport(scenario, reports::Status::kSkipped, plan.unmet, plan.transport);
  }
  return LaunchScenario(plan, options.launch);
}

}  // namespace

std::string Figure(const std::optional<double>& value, const char* format) {
  if (!value || std::isnan(*value)) return "-";
  if (*value != 0.0 && std::abs(*value) < 1e-99) return "~0";
  return fmt::format(fmt::runtime(format), *value);
}

size_t NameWidth(const std::vector<std::string>& names) {
  size_t width = 8;
  for (const auto& name : names) width = std::max(width, name.size());
  return width;
}

reports::ScenarioReport RunScenario(const scenarios::Scenario& scenario, const std::string& label,
                                    SuiteRunOptions& options, const std::string& position, size_t width,
                                    std::ostream& out) {
  // Threads per rank so that the ranks together use the cores this process may use, no more.
  options.launch.threads_per_rank = options.threads_per_rank > 0
                                        ? options.threads_per_rank
                                        : std::max(1, UsableCores() / static_cast<int>(scenario.Processes()));
  const auto start = std::chrono::steady_clock::now();
  options.launch.progress = [&](const std::string& line) {
    fmt::print(out, "{} {:<{}} ... {} ({:.0f} s)\n", position, label, width, line, SecondsSince(start));
    out.flush();
  };
  reports::ScenarioReport report;
  try {
    report = PlanAndLaunch(scenario, options);
  } catch (const Interrupted&) {
    throw;
  } catch (const std::exception& error) {
    report = FailedScenarioReport(scenario, reports::Status::kError, "launcher: " + ErrorMessage(error));
  }
  options.launch.progress = nullptr;  // it refers to this call's locals
  const double seconds = SecondsSince(start);
  report.summary.wall_s = seconds;
  const auto& r = report.summary;
  fmt::print(out, "{} {:<{}} {:<7} grad_rel {:>8} pp {:>7} tok/s {:6.1f} s{}\n", position, label, width,
             reports::StatusName(r.status), Figure(r.grad_max_rel_err, "{:.1e}"), Figure(r.pp_tokens_per_s, "{:.0f}"),
             seconds, r.ok ? "" : "  <- expected " + scenario.expect + ": " + r.message);
  out.flush();
  return report;
}

SuiteRun RunScenarios(const std::vector<scenarios::Scenario>& scenarios, const std::vector<std::string>& labels,
                      SuiteRunOptions& options, std::ostream& out,
                      const std::function<void(const std::vector<reports::ScenarioReport>&)>& finished) {
  std::vector<std::string> names = labels;
  if (names.empty()) {
    for (const auto& scenario : scenarios) names.push_back(scenario.name);
  }
  const size_t width = NameWidth(names);
  InstallInterruptHandlers();
  SuiteRun run;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    try {
      const std::string position = fmt::format("[{}/{}]", i + 1, scenarios.size());
      run.reports.push_back(RunScenario(scenarios[i], names[i], options, position, width, out));
    } catch (const Interrupted& interrupted) {
      run.interrupted = interrupted.signal;
      return run;
    }
    if (!run.reports.back().summary.ok) ++run.not_ok;
    if (finished) finished(run.reports);
  }
  return run;
}

}  // namespace pipecheck::harness
