// Another trainer under test (trainer=torch or external:PATH), through the external-trainer
// protocol (docs/protocol.md): pipecheck writes the scenario's configuration, initial weights and
// batches as torch.load-able files (PrepareExchange), starts the trainer's ranks (launcher.h),
// then reads what each rank handed back, checks it keeps the protocol, and judges it with the
// same judges as its own trainer (JudgeExchange). The torch trainer is trainers/torch_pipelining.py,
// the protocol's first user, not a special case.
#pragma once

#include <string>
#include <vector>

#include "harness/plan.h"
#include "pipeline/schedule.h"
#include "reports/report.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

// The exchange folders inside a scenario's work directory.
std::string ExchangeInputs(const std::string& directory);   // DIR/exchange/in
std::string ExchangeOutputs(const std::string& directory);  // DIR/exchange/out

// Writes config.json, weights.pt and batch_K.pt (every step) into ExchangeInputs(directory), and
// empties ExchangeOutputs(directory).
// `shape` as JudgeExchange's.
// A stretch of a resumed run (`segment`, plan.h) adds config.json's "resume": the step it starts
// at and the folders the trainer loads its own checkpoint from and writes it into.
void PrepareExchange(const scenarios::Scenario& scenario, const pipeline::PipelineShape& shape,
                     const std::string& directory, const Segment& segment = {});

// Reads ExchangeOutputs(directory) and judges it against the reference. A breach of the protocol
// (a missing file or step, an unknown name, a wrong shape, a non-finite number) is an ERROR
// naming the rank, step, file and what is wrong; otherwise the verdict of harness/parity.h.
// `shape`: where pipecheck's own schedule of the same layout puts the stages (the plan's).
// A stretch of a resumed run reads the steps from its first on, start.pt being what the ranks
// loaded, and is judged as one (parity.h's segment).
reports::ScenarioReport JudgeExchange(const scenarios::Scenario& scenario, const pipeline::PipelineShape& shape,
                                      const std::string& directory, const Segment& segment = {});

// The Python that runs trainer=torch and external:*.py trainers: $PIPECHECK_PYTHON, else the one
// this build was configured with (its torch is the LibTorch pipecheck links).
std::string TrainerPython();

// The command line of one rank of the scenario's trainer.
std::vector<std::string> TrainerCommand(const scenarios::Scenario& scenario);

// What the Python fork server imports before forking the scenario's ranks (a shipped adapter's
// framework, on the CPU), and the server's script; "" where its ranks start by exec (another
// trainer, or a GPU, where a framework's imports may initialise CUDA before the fork).
std::string TrainerPreload(const scenarios::Scenario& scenario);
std::string TrainerForkServer();

// The environment a trainer's rank gets on top of the torchrun contract (docs/protocol.md).
std::vector<std::pair<std::string, std::string>> TrainerEnvironment(const scenarios::Scenario& scenario,
                                                                    const std::string& directory, int threads);

// Why this machine cannot run the scenario's trainer ("" when it can): no Python, no PyTorch
// pipelining (torch < 2.4), an external program that is not there. Checked before anything runs.
std::string TrainerProblem(const scenarios::Scenario& scenario);

// The exchange's limits: a trainer's file larger than this is refused unread.
constexpr int64_t kMaxExchangeFileBytes = int64_t{4} << 30;

}  // namespace pipecheck::harness
