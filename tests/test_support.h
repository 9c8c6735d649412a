// Helpers shared by the test suites: tiny model configurations and tensor comparisons.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "harness/launcher.h"
#include "reports/report.h"
#include "reference/trainer.h"
#include "scenarios/scenario.h"

namespace pipecheck::testing {

// A model small enough for finite differences: 2 layers, hidden 8, 2 heads, vocab 13.
inline reference::TrainConfig TinyConfig(reference::Flavor flavor, bool tied) {
  reference::TrainConfig config;
  config.model.flavor = flavor;
  config.model.layers = 2;
  config.model.hidden = 8;
  config.model.heads = 2;
  config.model.vocab = 13;
  config.model.max_seq_len = 9;
  config.model.tied = tied;
  config.data.batch = 3;
  config.data.seq_len = 9;
  config.data.seq_len_min = 3;
  config.data.vocab = 13;
  config.seed = 77;
  return config;
}

// max |a - b| in float64.
inline double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// A summary row as a run writes it, for report and comparison tests: the given status, expectation
// and measurements, a baseline spread of 1% over three runs, and a message that needs quoting.
reports::ScenarioReport SummaryRow(const std::string& name, const std::string& status, const std::string& expect,
                                   double tokens_per_s, double peak_bytes, double grad_rel_err);

// A scratch directory unique to this test and process, removed first if it exists, and removed
// again after the last test if every test passed (kept, its path printed, if one failed or
// PIPECHECK_KEEP_SCRATCH=1).
std::string ScratchDirectory(const std::string& name);

// Launch options for real ranks of the pipecheck binary under test: one thread per rank, work
// in a fresh scratch directory called `name`.
harness::LaunchOptions TestLaunchOptions(const std::string& name, double timeout_seconds = 120);

// A scenario CSV (header and one row per scenario) with every column at its value.
std::string ScenariosCsv(const std::vector<scenarios::Scenario>& scenarios);

}  // namespace pipecheck::testing
