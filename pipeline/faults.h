// Named deviations from a correct pipeline, each modelled on a bug real pipeline trainers
// shipped. They are compiled in so pipecheck can prove it catches them, and inert unless a
// scenario's `fault` column names one. Not a fuzzer: each fault is one precise, known bug.
//
// A fault is a small object: `Fault` is the correct pipeline, and each bug is a subclass that
// changes what it needs at four seams (faults.cc, one class each, listed in FaultRegistry): the
// tensors passed between a stage's actions (TensorSeams), the executor's events
// (ExecutionObserver), the messages (FaultyTransport, the transport wrapper the executor sends
// through) and the step's gradient path (EditGradientPath). The executor and the trainer see the
// seams (seams.h), never a fault: SeamsFor builds them from the scenario's fault.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/gradient_path.h"
#include "pipeline/seams.h"
#include "pipeline/transport.h"

namespace pipecheck::pipeline {

// What a fault may need to know of the run it is injected into.
struct FaultContext {
  int microbatches = 1;
  int rank = 0;
  int world_size = 1;
  int64_t steps = 1;
  int replicas = 1;  // data_parallel
  int rounds = 1;    // accumulation: microbatches / rounds per round of the schedule
  torch::Dtype dtype = torch::kFloat64;  // the model's
};


class Fault : public TensorSeams, public ExecutionObserver {
 public:
  explicit Fault(const FaultContext& context = {}) : context_(context) {}
  ~Fault() override = default;

  // --- the schedule
  // Whether lowering posts receives ahead of the sends due with them.
  virtual bool PostReceivesFirst() const { return true; }

  // --- messages, through FaultyTransport (the executor's sends and receives only)
  virtual std::unique_ptr<PendingSend> Send(Transport& inner, const torch::Tensor& tensor, int peer, int tag);
  virtual std::unique_ptr<PendingRecv> Recv(Transport& inner, int peer, int tag, torch::Device device,
                                            const std::optional<MessageShape>& expected);

  // --- the trainer, after the schedule's actions: the gradient path (tied sum, replica average,
  // clip, optimizer step), which a fault may reorder, drop, alter or add to. Called once for each
  // Seams bundle SeamsFor builds (a trainer's, and the one the lowering asks for its receive
  // order); a stage added may keep `this` (the bundle owns the fault).
  virtual void EditGradientPath(GradientPath& /*path*/) {}

 protected:
  const FaultContext& context() const { return context_; }

 private:
  FaultContext context_;
};

struct FaultInfo {
  std::string name;     // as the scenario column spells it
  std::string summary;  // the bug, in one line
  std::unique_ptr<Fault> (*make)(const FaultContext&);
  // What parity must say when its row of scenarios/faults.csv runs: a regular expression its
  // message must match (tests/faults_test.cc holds every fault to it). Empty for a fault that
  // leaves every value right, which parity passes by design; `seen_by` then says what sees it.
  std::string caught_as;
  std::string seen_by;
};

// Every fault, "none" (the correct pipeline) first: the only list. A new fault is its class in
// faults.cc plus its line in faults.cc's table (name, summary, factory, the message it is caught
// with), and a row of scenarios/faults.csv that exposes it.
const std::vector<FaultInfo>& FaultRegistry();

// The registry's names, in order.
const std::vector<std::string>& FaultNames();

// The fault called `name`; throws std::invalid_argument for unknown names.
std::unique_ptr<Fault> MakeFault(const std::string& name, const FaultContext& context);

// `name` if it names a fault; throws std::invalid_argument otherwise.
const std::string& ParseFault(const std::string& name);

// What the fault injected on `rank` knows of the run.
FaultContext FaultContextOf(const PipelineConfig& config, int rank);

// Rank `rank`'s seams for a run of `config`: the correct pipeline's, or its fault's (the fault
// filling every seam it changes, the gradient path edited once).
Seams SeamsFor(const PipelineConfig& config, int rank);

// The executor's transport: sends and receives go through the injected fault's message hooks
// (which hand them straight to `inner` unless the fault corrupts messages); everything else is
// `inner`'s. Both are borrowed.
class FaultyTransport : public Transport {
 public:
  FaultyTransport(Transport& inner, Fault& fault) : inner_(inner), fault_(fault) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string name() const override { return inner_.name(); }
  std::unique_ptr<PendingSend> Send(const torch::Tensor& tensor, int peer, int tag,
                                    const std::optional<MessageShape>& announced) override;
  std::unique_ptr<PendingRecv> Recv(int peer, int tag, torch::Device device,
                                    const std::optional<MessageShape>& expected) override;
  void OpenChannels(const std::vector<std::pair<int, int>>& channels) override { inner_.OpenChannels(channels); }
  torch::Tensor SendBuffer(const torch::Tensor& like) override { return inner_.SendBuffer(like); }
  std::vector<double> AllGather(double value) override { return inner_.AllGather(value); }
  void Barrier() override { inner_.Barrier(); }
  void CheckReceived() override { inner_.CheckReceived(); }

 private:
  Transport& inner_;
  Fault& fault_;
};

}  // namespace pipecheck::pipeline
