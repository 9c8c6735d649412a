// `pipecheck worker`: one rank of one scenario. Reads the torchrun contract from its
// environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; SLURM_PROCID and
// SLURM_NTASKS stand in for RANK and WORLD_SIZE under srun), trains its pipeline stages, sends
// its results to rank 0; rank 0 then trains the reference, compares, and writes result.json
// plus summary.csv, params.csv and steps.csv into --out.
#pragma once

#include <string>

namespace pipecheck::harness {

struct WorkerOptions {
  // The scenario resolved by the launcher (plan.h: `run` and `invariance` write one per scenario);
  // "" resolves `scenario` from the suite at `scenarios_path` here, as under torchrun or srun.
  std::string plan;
  std::string scenarios_path;
  std::string scenario;
  std::string out;
  int threads = 0;  // intra-op threads; 0 keeps LibTorch's default
  std::string device;  // overrides the scenario's device ("" keeps it), as `run --device` does
  bool save_tensors = false;  // rank 0 also writes tensors.pt (losses, gradients, final weights) into out
  // How long a rank waits for its peers to rendezvous (rank 0's store, the process group) before
  // giving up with exit 2, naming what it waited for.
  double rendezvous_timeout_seconds = 300.0;
  // Timed steps wanted for tokens/s's spread: where the judged steps time fewer, timing-only
  // steps after them make up the difference (PipelineTrainer::RunTimingSteps); 0 none.
  int timed_steps = 0;
  // Another trainer under test (external.h): "prepare" its inputs, or "judge" its outputs, in
  // one process without a rendezvous; "" is a rank of pipecheck's own trainer.
  std::string phase;
};

// Exit code: rank 0 returns 0 when the scenario met its expectation and 1 when not; other
// ranks 0 once their results are delivered. Bad input (scenario, environment) is 2, and so is a
// rendezvous that never completes (no rank 0 at MASTER_ADDR:MASTER_PORT, a rank missing).
int RunWorker(const WorkerOptions& options);

// Name of the file rank 0 leaves in --out for the launcher.
constexpr const char* kResultFile = "result.json";

// Where rank `rank` keeps its flight record (pipeline/flight_recorder.h) in --out.
std::string FlightRecordPath(const std::string& out, int rank);

// Lines a worker prints to its log as steps finish; the launcher shows the latest.
constexpr const char* kProgressPrefix = "pipecheck progress: ";

// The line each rank of pipecheck's own trainer prints as it ends: how many suites it loaded,
// schedules it built and validated (none for a rank handed a plan), and simulations it ran.
constexpr const char* kPlanPrefix = "pipecheck plan: ";

}  // namespace pipecheck::harness
