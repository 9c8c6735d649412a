// Named deviations from a correct pipeline, each modelled on a bug real pipeline trainers
// shipped. They are compiled in so pipecheck can prove it catches them, and inert unless a
// scenario's `fault` column names one. Not a fuzzer: each fault is one precise, known bug.
//
// A fault is a small object: `Fault` is the correct pipeline, every hook a no-op (or the right
// answer), and each bug is a subclass that overrides the few hooks where it lives (faults.cc,
// one class each, listed in FaultRegistry). The executor and the trainer call the hooks at fixed
// points; the faults that corrupt messages do it inside FaultyTransport, a transport wrapper
// the executor sends through, so the correct code path carries no fault branch.
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
};

// What a rank's loss terms are divided by: the tokens of a microbatch, of its replica's
// microbatches, and of the whole global batch, and how many replicas share that batch.
struct LossTokens {
  int64_t microbatch = 0;
  int64_t replica = 0;
  int64_t batch = 0;
  int replicas = 1;
  // loss microbatch_mean: the microbatches each replica's step averages (every round's); 0 under
  // loss tokens.
  int64_t mean_over = 0;
};

class Fault {
 public:
  explicit Fault(const FaultContext& context = {}) : context_(context) {}
  virtual ~Fault() = default;

  // --- the schedule
  // Whether lowering posts receives ahead of the sends due with them.
  virtual bool PostReceivesFirst() const { return true; }

  // --- the executor, in the order a step calls them
  virtual void BeginStep() {}
  // Before action `index` of the `actions` this rank runs in `step`.
  virtual void BeforeAction(int64_t /*step*/, size_t /*index*/, size_t /*actions*/) const {}
  // The activation a stage takes from another rank, already a leaf that requires its gradient.
  virtual torch::Tensor ReceivedInput(const torch::Tensor& input) const { return input; }
  // The denominator of a microbatch's loss term: the whole global batch's tokens over the
  // replicas, so the replicas' average of their gradients is the whole batch's gradient; under
  // microbatch_mean its own tokens times the replica's microbatches (the replicas then average).
  virtual double LossDenominator(const LossTokens& tokens) const {
    if (tokens.mean_over > 0) return static_cast<double>(tokens.microbatch) * static_cast<double>(tokens.mean_over);
    return static_cast<double>(tokens.batch) / tokens.replicas;
  }
  // Before stage `stage` runs its forward over `input` (tokens (b, t) or activations (b, t, h)),
  // `parameters` being the stage's own.
  virtual void BeforeForward(int /*stage*/, const torch::Tensor& /*input*/,
                             const std::vector<torch::Tensor>& /*parameters*/) {}
  // The tensor a stage takes as its received input of `microbatch`: the received leaf itself.
  virtual torch::Tensor ReceiveBuffer(int /*stage*/, int /*microbatch*/, const torch::Tensor& input) { return input; }
  // Whose labels the loss of `microbatch` is computed with: its own.
  virtual int LabelsOf(int microbatch) const { return microbatch; }
  // The input a stage keeps for its backward to recompute its forward from (recompute=1).
  virtual torch::Tensor KeptForRecompute(int /*stage*/, const torch::Tensor& input) { return input; }
  // The gradient a backward of `microbatch` starts from (ones for the loss, else the output's).
  virtual torch::Tensor BackwardSeed(const torch::Tensor& gradient, int /*microbatch*/) const { return gradient; }
  // The input gradient a backward hands back (undefined where its input had no graph).
  virtual torch::Tensor InputGradient(const torch::Tensor& gradient, const torch::Tensor& /*input*/) const {
    return gradient;
  }
  // Stage `stage`'s input gradient of `microbatch` as a backward makes it, and as it is later
  // sent or handed over: the one made for that microbatch.
  virtual void InputGradientMade(int /*stage*/, int /*microbatch*/, const torch::Tensor& /*gradient*/) {}
  virtual torch::Tensor InputGradientTaken(int /*stage*/, int /*microbatch*/, const torch::Tensor& gradient) {
    return gradient;
  }
  // Around every backward that accumulates into `parameters` (a B, or a W).
  virtual void BeforeBackward(const std::vector<torch::Tensor>& /*parameters*/) {}
  virtual void AfterBackward(const std::vector<torch::Tensor>& /*parameters*/) {}
  // After this rank's last backward (B or W) of accumulation round `round` (every step has at
  // least one round): the rounds' gradients simply add up, so nothing happens here.
  virtual void AfterRound(int /*round*/, const std::vector<torch::Tensor>& /*parameters*/) {}
  // Whether a backward's reduced-precision gradients move into float32 sums (else they add up in
  // the parameter's dtype, as autograd's own accumulation does).
  virtual bool SumsInFloat32() const { return true; }
  // Around a W of `module`: what the first returns is handed to the second.
  virtual torch::Tensor BeforeWeightGradient(const torch::nn::Module& /*module*/) const { return {}; }
  virtual void AfterWeightGradient(const torch::nn::Module& /*module*/, const torch::Tensor& /*before*/) const {}

  // --- messages, through FaultyTransport (the executor's sends and receives only)
  virtual std::unique_ptr<PendingSend> Send(Transport& inner, const torch::Tensor& tensor, int peer, int tag);
  virtual std::unique_ptr<PendingRecv> Recv(Transport& inner, int peer, int tag, torch::Device device,
                                            const std::optional<MessageShape>& expected);

  // --- the trainer, after the schedule's actions: the gradient path (tied sum, replica average,
  // clip, optimizer step), which a fault may reorder, drop, alter or add to. Called once, when
  // the trainer is built; a stage added may keep `this` (the fault outlives the trainer's steps).
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
// faults.cc plus its entry here (name, summary, factory, the message it is caught with), and a
// row of scenarios/faults.csv that exposes it.
const std::vector<FaultInfo>& FaultRegistry();

// The registry's names, in order.
const std::vector<std::string>& FaultNames();

// The fault called `name`; throws std::invalid_argument for unknown names.
std::unique_ptr<Fault> MakeFault(const std::string& name, const FaultContext& context);

// `name` if it names a fault; throws std::invalid_argument otherwise.
const std::string& ParseFault(const std::string& name);

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
  std::vector<double> AllGather(double value) override { return inner_.AllGather(value); }
  void Barrier() override { inner_.Barrier(); }
  void CheckReceived() override { inner_.CheckReceived(); }

 private:
  Transport& inner_;
  Fault& fault_;
};

}  // namespace pipecheck::pipeline
