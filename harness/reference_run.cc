// The reference trainer over a suite (see reference_run.h).
#include "harness/reference_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fmt/ostream.h>

#include <chrono>
#include <cmath>

#include "harness/errors.h"
#include "harness/scenario_model.h"
#include "reference/trainer.h"

namespace pipecheck::harness {
namespace {

// Trains one scenario; returns "" on success or what went wrong.
std::string RunOne(const scenarios::Scenario& scenario, const ReferenceRunOptions& options, std::ostream& out) {
  auto config = ToTrainConfig(scenario);
  config.record_gradients = false;
  config.phase_times = options.phases;
  if (options.microbatched) config.microbatches = scenario.microbatches;
  reference::ReferenceTrainer trainer(config);
  const auto result = trainer.Train();
  std::vector<std::string> losses;
  bool finite = true;
  for (const auto& step : result.steps) {
    losses.push_back(fmt::format("{:.12f}", step.loss));
    finite = finite && std::isfinite(step.loss);
  }
  const double median_ms = result.MedianStepMs();
  const double tokens_per_s = result.MedianTokensPerSecond();
  fmt::print(out, "{:<32} {:>8.2f} {:>12.0f}  {}\n", scenario.name, median_ms, tokens_per_s, fmt::join(losses, " "));
  if (options.phases) {
    std::vector<std::string> phases;
    for (const auto& [phase, ms] : result.MedianPhaseMs()) phases.push_back(fmt::format("{}={:.3f}", phase, ms));
    fmt::print(out, "  phases_ms {}\n", fmt::join(phases, " "));
  }
  return finite ? "" : "non-finite loss";
}

}  // namespace

int RunReferenceSuite(const std::vector<scenarios::Scenario>& scenarios, const ReferenceRunOptions& options,
                      std::ostream& out) {
  if (options.microbatched) fmt::print(out, "each batch as its scenario's microbatches, one after another\n");
  fmt::print(out, "{:<32} {:>8} {:>12}  {}\n", "scenario", "step_ms", "tokens/s", "loss per step");
  int failures = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& scenario : scenarios) {
    std::string problem;
    try {
      problem = RunOne(scenario, options, out);
    } catch (const std::exception& error) {
      problem = ErrorMessage(error);
    }
    if (!problem.empty()) {
      ++failures;
      fmt::print(out, "{:<32} ERROR: {}\n", scenario.name, problem);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(out, "{} scenarios, {} failed, {:.1f} s (step_ms: median after one warm-up step)\n",
             scenarios.size(), failures, seconds);
  return failures == 0 ? 0 : 1;
}

}  // namespace pipecheck::harness
