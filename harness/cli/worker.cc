// `pipecheck worker`: one rank of a scenario (started by run, invariance, torchrun or srun).
#include "harness/cli/commands.h"

#include <memory>

#include "harness/worker.h"
#include "pipeline/trainer.h"

namespace pipecheck::cli {

Command AddWorker(CLI::App& app) {
  auto options = std::make_shared<harness::WorkerOptions>();
  options->scenarios_path = kDefaultSuite;
  options->out = kDefaultOut;
  auto* command = app.add_subcommand("worker", "One rank of one scenario (environment: RANK, WORLD_SIZE, "
                                               "MASTER_ADDR, MASTER_PORT, as torchrun and SLURM set them)");
  auto* scenarios = AddScenarios(command, options->scenarios_path);
  auto* plan = command->add_option("--plan", options->plan,
                                   "The scenario's plan, as `pipecheck run` writes it (work/NAME/plan.json): "
                                   "nothing is loaded or resolved again");
  auto* scenario = command->add_option("--scenario", options->scenario, "Scenario name (without --plan)");
  command->add_option("--out", options->out, "Where rank 0 writes the reports (default reports/latest)");
  auto* device = AddDevice(command, options->device, "Override the scenario's device (without --plan)");
  // A plan holds the scenario, its suite's path and its device already: naming them again is a mistake.
  for (auto* given : {scenario, scenarios, device}) plan->excludes(given);
  AddThreads(command, options->threads, "Intra-op threads (0: LibTorch's default)");
  command->add_option("--rendezvous-timeout", options->rendezvous_timeout_seconds,
                      "Seconds to wait for the other ranks to rendezvous; then exit 2 naming what was missing")
      ->check(FiniteIn(1, 86400, "seconds from 1 to 86400 (a day)"))->capture_default_str();
  command->add_flag("--save-tensors", options->save_tensors,
                    "Rank 0 also writes tensors.pt: every step's loss and applied gradients, the final weights");
  options->timed_steps = pipeline::kTimedSamples;
  command->add_option("--timed-steps", options->timed_steps,
                      "Steps to time for tokens/s and its spread: timing-only steps follow the judged ones where "
                      "those time fewer (bounded in time; 0: none)")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  command->add_option("--phase", options->phase,
                      "For another trainer under test (trainer=torch, torchtitan, deepspeed, megatron, external:PATH; one process, no rendezvous): "
                      "'prepare' writes its inputs into --out's exchange folder, 'judge' judges what it handed back")
      ->check(CLI::IsMember({"prepare", "judge"}));
  return {command, "worker", [options] { return harness::RunWorker(*options); }};
}

}  // namespace pipecheck::cli
