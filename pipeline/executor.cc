// The pipeline executor (see executor.h).
#include "pipeline/executor.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "pipeline/message.h"
#include "reference/attention_core.h"
#include "reference/device.h"
#include "reference/linear.h"
#include "reference/loss.h"
#include "reference/model.h"

namespace pipecheck::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using StageMicrobatch = std::pair<int, int>;

// The entry of `waiting` for (stage, microbatch), which an earlier action of this rank left;
// a clear error when none is there (the list ran an action before the one that makes its
// input, or an entry was taken twice).
template <typename Value>
Value& Waiting(std::map<StageMicrobatch, Value>& waiting, const StageMicrobatch& key, const char* what, int rank) {
  const auto it = waiting.find(key);
  TORCH_CHECK(it != waiting.end(), "rank ", rank, ": no ", what, " of stage ", key.first, ", microbatch ", key.second,
              " is waiting: it was never made, or was already used");
  return it->second;
}

// Megatron's memory trick: once an output has been sent, backward needs only its graph, so its
// data can go. Only for outputs whose producing op keeps no reference to its own result
// (an addition, an embedding lookup): for any other op freeing could corrupt backward.
void ReleaseOutputData(torch::Tensor& output) {
  const auto function = output.grad_fn();
  if (!function) return;  // an empty stage's output is its input: nothing of its own to free
  const std::string name = function->name();
  if (name == "AddBackward0" || name == "EmbeddingBackward0") output.set_data(torch::empty({0}, output.options()));
}

// Backward from `output` with `gradient`, straight through the engine: unlike
// torch::autograd::backward it does not compare against the output's (possibly freed) data.
// With `aux` (a stage's balance-loss terms) a second root, its gradient 1: both in one backward.
// Returns the gradients of `outputs` (none without them).
// The backward's roots: the output's edge, and the balance-loss terms' where they have a graph.
torch::autograd::edge_list RootEdges(const torch::Tensor& output, const torch::Tensor& aux) {
  torch::autograd::edge_list roots{torch::autograd::impl::gradient_edge(output)};
  if (aux.defined() && aux.requires_grad()) roots.push_back(torch::autograd::impl::gradient_edge(aux));
  return roots;
}

torch::autograd::variable_list BackwardFrom(const torch::Tensor& output, const torch::Tensor& gradient,
                                            const torch::Tensor& aux, const torch::autograd::edge_list& outputs = {},
                                            bool keep_graph = false, bool accumulate_grad = true) {
  const torch::autograd::edge_list roots = RootEdges(output, aux);
  torch::autograd::variable_list gradients{gradient};
  if (roots.size() > 1) gradients.push_back(torch::ones_like(aux));
  return torch::autograd::Engine::get_default_engine().execute(roots, gradients, keep_graph, /*create_graph=*/false,
                                                               accumulate_grad, outputs);
}

// The head's loss term with its stage's balance-loss terms added (the terms in their own dtype).
torch::Tensor WithAux(const torch::Tensor& loss, const torch::Tensor& aux) {
  return aux.defined() ? loss + aux.to(loss.scalar_type()) : loss;
}

// Frees what a node saved as soon as it has run: a node W will not run again (a post-hook, so I's
// peak does not hold every saved tensor beside the gradients it captures).
class ReleaseOnceRun : public torch::autograd::FunctionPostHook {
 public:
  explicit ReleaseOnceRun(torch::autograd::Node* node) : node_(node) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    node_->release_variables();
    return outputs;
  }

 private:
  torch::autograd::Node* node_;  // the hook's owner
};

}  // namespace

// The weight plan's types have external linkage (only this file defines them): a StepState member
// holds them, and in a unity build this file is included into another, where a field of an
// anonymous namespace's type would be a GCC -Wsubobject-linkage error.

// A split backward's W without a second walk down the graph. PyTorch's pipelining does the same
// (torch/distributed/pipelining/_backward.py calls the nodes "intermediates"): a parameter's
// gradient paths leave the input's at the last graph nodes that still lead to the input. I
// captures the gradient flowing into each of those nodes as it passes them; W starts from there
// and walks only the parameter side, so the activation gradients are computed once, by I.
// Parameters whose paths meet at a node share a group: one engine call per group, each call's
// outputs its own parameters only, so nothing flows down the input side again. The plan gives up
// (`ok` false; W then walks the whole graph again from the root) where it cannot be sure of that:
// a root that does not lead to the input, a node with several inputs, or a group where one such
// node lies below another (the lower one's gradient would be counted twice).
struct WeightGroup {
  torch::autograd::edge_list roots;          // (node, 0): where the gradient is captured
  torch::autograd::variable_list gradients;  // what I captured there
  torch::autograd::edge_list parameters;
};

struct WeightPlan {
  bool ok = false;
  std::vector<WeightGroup> groups;
  // The nodes W does not run: once I has run, what they saved can go (their gradients are made).
  std::vector<torch::autograd::Node*> spent;
};

namespace {

WeightPlan PlanWeightGradients(const torch::autograd::edge_list& roots, const torch::autograd::Edge& input,
                               const std::vector<torch::Tensor>& parameters) {
  using torch::autograd::Node;
  using NodePointer = decltype(torch::autograd::Edge::function);  // a shared_ptr or an intrusive_ptr, by release
  WeightPlan plan;
  // Every node below the roots, and each node's parents (the nodes with an edge to it).
  std::unordered_map<Node*, NodePointer> nodes;
  std::unordered_map<Node*, std::vector<Node*>> parents;
  std::vector<Node*> stack;
  for (const auto& root : roots) {
    if (!root.is_valid()) return plan;
    if (nodes.emplace(root.function.get(), root.function).second) stack.push_back(root.function.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      if (!edge.is_valid()) continue;
      parents[edge.function.get()].push_back(node);
      if (nodes.emplace(edge.function.get(), edge.function).second) stack.push_back(edge.function.get());
    }
  }
  // Up the graph from `start` (towards the roots), each node once: `climb(parent)` says whether
  // to go on above it.
  const auto up_from = [&](Node* start, const std::function<bool(Node*)>& climb) {
    std::unordered_set<Node*> visited{start};
    stack.assign({start});
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (Node* parent : parents[node]) {
        if (visited.insert(parent).second && climb(parent)) stack.push_back(parent);
      }
    }
  };
  // Down the graph from `start` (towards the leaves), into the children `descend(child)` takes.
  const auto down_from = [&](Node* start, const std::function<bool(Node*)>& descend) {
    stack.assign({start});
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const auto& edge : node->next_edges()) {
        Node* child = edge.function.get();
        if (child != nullptr && descend(child)) stack.push_back(child);
      }
    }
  };
  // The input's side: every node the input's gradient flows through.
  std::unordered_set<Node*> input_side{input.function.get()};
  up_from(input.function.get(), [&](Node* node) { return input_side.insert(node).second; });
  for (const auto& root : roots) {
    if (input_side.count(root.function.get()) == 0) return plan;
  }
  // Each parameter's meeting nodes: up from its accumulator until the input's side.
  std::vector<std::vector<Node*>> meets;  // per parameter in the graph
  torch::autograd::edge_list edges;
  for (const auto& parameter : parameters) {
    if (!parameter.requires_grad()) continue;
    auto edge = torch::autograd::impl::gradient_edge(parameter);
    if (nodes.count(edge.function.get()) == 0) continue;  // not used by this stage's forward
    std::vector<Node*> found;
    up_from(edge.function.get(), [&](Node* node) {
      if (input_side.count(node) == 0) return true;
      found.push_back(node);
      return false;
    });
    if (found.empty()) return plan;
    meets.push_back(std::move(found));
    edges.push_back(std::move(edge));
  }
  // Parameters that share a meeting node share a group (union-find over the parameters).
  std::vector<size_t> group_of(meets.size());
  std::iota(group_of.begin(), group_of.end(), 0);
  const std::function<size_t(size_t)> find = [&](size_t i) {
    return group_of[i] == i ? i : group_of[i] = find(group_of[i]);
  };
  std::unordered_map<Node*, size_t> owner;
  for (size_t i = 0; i < meets.size(); ++i) {
    for (Node* node : meets[i]) {
      const auto [it, fresh] = owner.emplace(node, i);
      if (fresh) continue;
      const size_t a = find(i), b = find(it->second);
      group_of[std::max(a, b)] = std::min(a, b);  // a group is named by its first parameter
    }
  }
  std::map<size_t, WeightGroup> groups;
  std::map<size_t, std::vector<Node*>> group_nodes;
  for (size_t i = 0; i < meets.size(); ++i) groups[find(i)].parameters.push_back(edges[i]);
  for (const auto& [node, i] : owner) {
    if (node->num_inputs() != 1) return plan;
    group_nodes[find(i)].push_back(node);
  }
  for (auto& [root, members] : group_nodes) {
    std::sort(members.begin(), members.end(), [](Node* a, Node* b) { return a->sequence_nr() > b->sequence_nr(); });
    if (members.size() > 1) {
      // No meeting node of a group below another: down the input's side from each.
      const std::unordered_set<Node*> member_set(members.begin(), members.end());
      bool nested = false;
      for (Node* top : members) {
        std::unordered_set<Node*> below;
        down_from(top, [&](Node* child) {
          if (input_side.count(child) == 0 || !below.insert(child).second) return false;
          nested = nested || member_set.count(child) > 0;
          return !nested;
        });
        if (nested) return plan;
      }
    }
    for (Node* node : members) groups[root].roots.emplace_back(nodes.at(node), uint32_t{0});
  }
  // What W runs: each meeting node and, below it, what lies off the input's side.
  std::unordered_set<Node*> weight_side;
  for (const auto& [node, i] : owner) {
    weight_side.insert(node);
    down_from(node, [&](Node* child) { return input_side.count(child) == 0 && weight_side.insert(child).second; });
  }
  for (const auto& [node, pointer] : nodes) {
    if (weight_side.count(node) == 0) plan.spent.push_back(node);
  }
  for (auto& [root, group] : groups) plan.groups.push_back(std::move(group));
  plan.ok = true;
  return plan;
}

}  // namespace

// What an I leaves for its W: the backward's root and gradient (the graph hangs off the root),
// and the stage's input, kept so the graph's leaf lives as long as the graph; with a plan, the
// gradients I captured for W to start from (else W walks the graph again from the root).
struct WeightWork {
  torch::Tensor root, gradient, input, aux;
  WeightPlan plan;
};

// Everything one step keeps between actions, keyed by (stage, microbatch). Each entry is
// removed by the action that consumes it, so an empty state at the end proves the list did
// all its work.
struct Executor::StepState {
  int64_t step = 0;
  reference::Batch batch;
  std::vector<reference::Batch> microbatches;
  std::map<StageMicrobatch, torch::Tensor> inputs;       // leaf inputs of non-first stages
  std::map<StageMicrobatch, torch::Tensor> outputs;      // outputs of non-last stages (graph)
  std::map<StageMicrobatch, torch::Tensor> losses;       // last stage's loss terms (its balance loss added)
  std::map<StageMicrobatch, torch::Tensor> aux;          // other stages' balance-loss terms (graph)
  std::map<StageMicrobatch, torch::Tensor> input_grads;  // waiting to be sent or handed on
  std::map<StageMicrobatch, WeightWork> weight_work;     // I done, W not yet: what W starts from
  std::map<Message, std::unique_ptr<PendingRecv>> receives;  // posted
  std::map<Message, torch::Tensor> arrived;                   // not yet used
  // The send in flight per (peer, direction): the next one to the same place waits for it.
  std::map<std::pair<int, Direction>, std::unique_ptr<PendingSend>> sends;
  int64_t replica_tokens = 0;  // of this replica's microbatches (the whole batch's with one replica)
  torch::Tensor loss_sum;  // 0-dim float64 on the device
  torch::Tensor aux_sum;   // this rank's balance-loss terms, 0-dim float64; undefined if none
  std::map<int64_t, torch::Tensor> expert_counts;  // routing counts by layer (CountRouting)
  std::map<std::pair<int64_t, int>, torch::Tensor> routing;  // choices by (layer, microbatch)
  std::vector<BoundaryRecord> probes;    // fingerprints without their numbers yet
  std::vector<torch::Tensor> probe_values;  // their numbers, (4) each, still on the device (else undefined)
};

Executor::Executor(const PipelineConfig& config, const Schedule& schedule, Stages& stages, Transport& transport,
                   TensorSeams& tensors, ExecutionObserver& observer, reference::GradientAccumulator& accumulator)
    : config_(config), schedule_(schedule), stages_(stages), transport_(transport), tensors_(tensors), observer_(observer),
      accumulator_(accumulator), clock_(config.train.device),
      owned_parameters_(OwnedParameters(stages, config.train.model.tied, /*count_tied_copy=*/true)) {
  const auto& actions = schedule_.ranks[transport_.rank()];
  const int per_round = config.microbatches / config.accumulation;
  std::map<int, size_t> last;  // round -> index
  for (size_t i = 0; i < actions.size(); ++i) {
    const ActionKind kind = actions[i].kind;
    if (kind == ActionKind::kBackward || kind == ActionKind::kBackwardWeight) last[actions[i].microbatch / per_round] = i;
    if (kind == ActionKind::kForward) last_forward_ = i;
  }
  for (const auto& [round, index] : last) round_ends_[index] = round;
}

Executor::~Executor() = default;

bool Executor::OnThisRank(int stage) const { return schedule_.shape.RankOfStage(stage) == transport_.rank(); }

// Activations and their gradients are (microbatch's sequences, its padded length, hidden).
MessageShape Executor::PlannedMessage(int microbatch, const StepState& state) const {
  const auto& part = state.microbatches[microbatch];
  return {config_.train.dtype, {part.tokens.size(0), part.time(), config_.train.model.hidden}};
}

void Executor::Forward(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  const auto& part = state.microbatches[mb];
  const auto device = config_.train.device;
  Stage& stage = StageAt(stages_, s, transport_.rank());
  torch::Tensor input;
  if (s == 0) {
    input = reference::ToDevice(part.tokens, device);  // (b, t) int64
  } else if (OnThisRank(s - 1)) {
    input = Waiting(state.outputs, {s - 1, mb}, "output", transport_.rank())
                .detach()
                .requires_grad_(true);  // (b, t, hidden)
    state.inputs[{s, mb}] = input;
    Probe(input, Direction::kActivation, s, mb, BoundaryRole::kHandedOver, -1, state);
  } else {
    input = tensors_.ReceivedInput(TakeArrived(action, state).requires_grad_(true));  // (b, t, hidden)
    input = tensors_.ReceiveBuffer(s, mb, input);
    state.inputs[{s, mb}] = input;
    Probe(input, Direction::kActivation, s, mb, BoundaryRole::kReceived, schedule_.shape.RankOfStage(s - 1), state);
  }
  // Recomputation keeps only the input (stage 0's is the batch's tokens): the forward builds no
  // graph, and the backward runs it again from what was kept.
  if (config_.recompute && s > 0) state.inputs[{s, mb}] = tensors_.KeptForRecompute(s, input);
  observer_.BeforeForward(s, input, stage.parameters);
  std::optional<torch::NoGradGuard> no_graph;
  if (config_.recompute) no_graph.emplace();
  torch::Tensor aux;
  reference::MoeRecord moe;
  auto output = StageForward(stage, mb, input, state, &aux, &moe);
  tensors_.CountRouting(/*recomputed=*/false, moe.counts, state.expert_counts);
  for (const auto& [layer, chosen] : moe.chosen) state.routing[{layer, mb}] = chosen;
  if (aux.defined()) {
    auto value = aux.detach().to(torch::kFloat64);
    state.aux_sum = state.aux_sum.defined() ? state.aux_sum + value : value;
  }
  if (!stage.slice.has_head) {
    state.outputs[{s, mb}] = output;
    if (aux.defined() && aux.requires_grad()) state.aux[{s, mb}] = aux;
    return;
  }
  const auto& loss = output;
  // Accumulated on the device: reading it per microbatch would sync the host with the device.
  auto term = loss.detach().to(torch::kFloat64);
  state.loss_sum = state.loss_sum.defined() ? state.loss_sum + term : term;
  state.losses[{s, mb}] = WithAux(loss, aux);
}

// Summed token loss over the *whole global batch's* token count (the replicas' gradients are
// then summed): microbatch terms add up exactly.
torch::Tensor Executor::LossOf(const torch::Tensor& output, int microbatch, const StepState& state) const {
  const auto& part = state.microbatches[microbatch];
  const LossTokens tokens{part.valid_tokens, state.replica_tokens, state.batch.valid_tokens, config_.data_parallel,
                          config_.train.loss_microbatches > 0 ? config_.microbatches : 0};
  const auto& labels = state.microbatches[tensors_.LabelsOf(microbatch)].labels;
  return reference::TokenLossSum(output, reference::ToDevice(labels, config_.train.device)) /
         tensors_.LossDenominator(tokens);
}

torch::Tensor Executor::StageForward(Stage& stage, int microbatch, const torch::Tensor& input,
                                     const StepState& state, torch::Tensor* aux, reference::MoeRecord* moe) const {
  const auto& part = state.microbatches[microbatch];
  const auto& model = config_.train.model;
  // The mask (and llama's rotary tables) only where the stage has layers to use them: a stage of
  // an embedding or a head alone would build them for nothing, every microbatch.
  const bool has_layers = stage.slice.end_layer > stage.slice.first_layer;
  // The balance loss's 1/B is over the whole step's batch, every replica's sequences.
  auto context = has_layers ? reference::MakeAttentionContext(model, part.lengths, part.time(), config_.train.dtype,
                                                              config_.train.device, state.batch.size())
                            : reference::AttentionContext{};
  if (model.MoeLayersIn(stage.slice.first_layer, stage.slice.end_layer) > 0) {
    context.moe = std::make_shared<reference::MoeRecord>();
    tensors_.MoeContext(context);
  }
  auto output = stage.module->forward(input, context);
  if (moe != nullptr && context.moe) *moe = *context.moe;
  if (aux != nullptr) {
    const auto terms = context.moe ? context.moe->BalanceLoss() : torch::Tensor();
    const BalanceTermsAt at{stage.index, microbatch, stage.slice.has_head, part.size(), state.batch.size()};
    *aux = terms.defined() ? tensors_.BalanceTerms(at, terms) : terms;
  }
  return stage.slice.has_head ? LossOf(output, microbatch, state) : output;
}

torch::Tensor Executor::Recompute(int s, int mb, StepState& state, torch::Tensor* aux) {
  torch::Tensor input;
  if (s == 0) {
    input = reference::ToDevice(state.microbatches[mb].tokens, config_.train.device);
  } else {
    // A fresh leaf over the kept input: its gradient is this backward's alone.
    input = Waiting(state.inputs, {s, mb}, "input", transport_.rank()).detach().requires_grad_(true);
    state.inputs[{s, mb}] = input;
  }
  reference::MoeRecord moe;
  auto output = StageForward(StageAt(stages_, s, transport_.rank()), mb, input, state, aux, &moe);
  tensors_.CountRouting(/*recomputed=*/true, moe.counts, state.expert_counts);
  return output;
}

Executor::BackwardRoot Executor::TakeBackwardRoot(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  BackwardRoot start;
  if (StageAt(stages_, s, transport_.rank()).slice.has_head) {
    if (config_.recompute) {
      torch::Tensor aux;
      auto loss = Recompute(s, mb, state, &aux);
      start.root = WithAux(loss, aux);
    } else {
      start.root = Waiting(state.losses, {s, mb}, "loss term", transport_.rank());
    }
    state.losses.erase({s, mb});
    start.gradient = tensors_.BackwardSeed(torch::ones_like(start.root), mb);
    return start;
  }
  if (OnThisRank(s + 1)) {
    start.gradient = Waiting(state.input_grads, {s + 1, mb}, "input gradient", transport_.rank());
    start.gradient = tensors_.InputGradientTaken(s + 1, mb, start.gradient);
    state.input_grads.erase({s + 1, mb});
    Probe(start.gradient, Direction::kGradient, s, mb, BoundaryRole::kHandedOver, -1, state);
  } else {
    start.gradient = TakeArrived(action, state);  // (b, t, hidden)
    Probe(start.gradient, Direction::kGradient, s, mb, BoundaryRole::kReceived, schedule_.shape.RankOfStage(s + 1),
          state);
  }
  if (config_.recompute) {
    start.root = Recompute(s, mb, state, &start.aux);
  } else {
    start.root = Waiting(state.outputs, {s, mb}, "output", transport_.rank());
    if (auto aux = state.aux.find({s, mb}); aux != state.aux.end()) {
      start.aux = aux->second;
      state.aux.erase(aux);
    }
  }
  state.outputs.erase({s, mb});
  start.passthrough = !start.root.grad_fn();
  start.gradient = tensors_.BackwardSeed(start.gradient, mb);
  return start;
}

void Executor::KeepInputGradient(const Action& action, torch::Tensor gradient, const torch::Tensor& input,
                                 StepState& state) {
  const int mb = action.microbatch;
  gradient = tensors_.InputGradient(gradient, input);
  TORCH_CHECK(gradient.defined(), "rank ", transport_.rank(), ": ", action.ToString(),
              " produced no gradient for its input");
  state.input_grads[{action.stage, mb}] = gradient;
  tensors_.InputGradientMade(action.stage, mb, gradient);
}

void Executor::Backward(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  observer_.BeforeBackward(owned_parameters_);
  const BackwardRoot start = TakeBackwardRoot(action, state);
  if (!start.passthrough) {
    const reference::FusedWeightGradients fused;  // into .grad, as this backward accumulates there
    const reference::SingleWalkBackward once;     // the graph goes with it
    BackwardFrom(start.root, start.gradient, start.aux);
  }
  AfterParameterGradients(action);
  if (s == 0) return;
  auto input = Waiting(state.inputs, {s, mb}, "input", transport_.rank());
  state.inputs.erase({s, mb});
  KeepInputGradient(action, start.passthrough ? start.gradient : input.grad(), input, state);
}

void Executor::BackwardInput(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  BackwardRoot start = TakeBackwardRoot(action, state);
  torch::Tensor input;
  if (s > 0) {
    input = Waiting(state.inputs, {s, mb}, "input", transport_.rank());
    state.inputs.erase({s, mb});
  }
  torch::Tensor gradient;
  WeightPlan plan;
  if (start.passthrough) {
    gradient = start.gradient;
  } else if (s > 0 && input.requires_grad()) {
    // The input's edge, and the gradients W will start from: no parameter gradient is touched,
    // and the graph stays for W. A stage of the head alone keeps its whole graph for W instead:
    // walking its final norm and projection again costs little, and what I would capture there
    // (the logits' gradient beside the norm's) outweighs what it would free.
    const auto input_edge = torch::autograd::impl::gradient_edge(input);
    const Stage& stage = StageAt(stages_, s, transport_.rank());
    if (stage.slice.end_layer > stage.slice.first_layer) {
      plan = PlanWeightGradients(RootEdges(start.root, start.aux), input_edge, stage.module->parameters());
    }
    for (auto* node : plan.spent) node->add_post_hook(std::make_unique<ReleaseOnceRun>(node));
    torch::autograd::edge_list outputs{input_edge};
    for (const auto& group : plan.groups) outputs.insert(outputs.end(), group.roots.begin(), group.roots.end());
    // With a plan, W walks from the nodes where the weights' paths leave the input's, never again
    // down the input's side: what I passes there is walked once. Without one, W walks it all again.
    std::optional<reference::SingleWalkBackward> once;
    if (plan.ok) once.emplace();
    const auto gradients = BackwardFrom(start.root, start.gradient, start.aux, outputs, /*keep_graph=*/true,
                                        /*accumulate_grad=*/false);
    once.reset();
    gradient = gradients[0];
    size_t next = 1;
    for (auto& group : plan.groups) {
      for (size_t i = 0; i < group.roots.size(); ++i) group.gradients.push_back(gradients[next++]);
    }
    for (auto* node : plan.spent) node->release_variables();  // those I did not run
    plan.spent.clear();
  }
  if (s > 0) KeepInputGradient(action, gradient, input, state);
  // An empty stage's W runs nothing: it keeps nothing for it either (held from I to W, the gradient
  // passed through would stay allocated until W, which ZB-H1 defers by up to p - 1 microbatches).
  // With a plan W needs the plan alone: its nodes hold what they saved, and its gradients.
  if (start.passthrough) {
    state.weight_work[{s, mb}] = WeightWork{};
  } else if (plan.ok) {
    state.weight_work[{s, mb}] = WeightWork{{}, {}, {}, {}, std::move(plan)};
  } else {
    state.weight_work[{s, mb}] = WeightWork{start.root, start.gradient, input, start.aux, std::move(plan)};
  }
}

void Executor::BackwardWeight(const Action& action, StepState& state) {
  const int s = action.stage, mb = action.microbatch;
  auto work = state.weight_work.find({s, mb});
  TORCH_CHECK(work != state.weight_work.end(), "rank ", transport_.rank(), ": ", action.ToString(),
              " has no input-gradient step (I) before it");
  WeightWork pending = std::move(work->second);
  state.weight_work.erase(work);
  if (!pending.root.defined() && !pending.plan.ok) return;  // an empty stage has no weights
  observer_.BeforeBackward(owned_parameters_);
  const torch::nn::Module& module = *StageAt(stages_, s, transport_.rank()).module;
  const auto before = tensors_.BeforeWeightGradient(module);
  const reference::FusedWeightGradients fused;  // W accumulates into .grad: its products may add there
  if (pending.plan.ok) {
    // From where I captured each group's gradients, towards the group's parameters alone; the
    // groups' walks share no node, so each frees what its nodes saved, and its captured
    // gradients go with it.
    for (auto& group : pending.plan.groups) {
      torch::autograd::edge_list roots;
      torch::autograd::variable_list gradients;
      for (size_t i = 0; i < group.roots.size(); ++i) {
        if (!group.gradients[i].defined()) continue;  // nothing reached that node
        roots.push_back(group.roots[i]);
        gradients.push_back(std::move(group.gradients[i]));
      }
      group.gradients.clear();
      if (roots.empty()) continue;
      torch::autograd::Engine::get_default_engine().execute(roots, gradients, /*keep_graph=*/false,
                                                           /*create_graph=*/false, /*accumulate_grad=*/true,
                                                           group.parameters);
    }
    pending.plan.groups.clear();
  } else {
    // The graph kept by I once more, towards the parameters' edges only: what leads to nothing
    // but the stage's input (already handed on by I) is not run again.
    torch::autograd::edge_list parameter_edges;
    for (const auto& parameter : module.parameters()) {
      if (parameter.requires_grad()) parameter_edges.push_back(torch::autograd::impl::gradient_edge(parameter));
    }
    const reference::SingleWalkBackward once;  // the graph goes with this walk
    BackwardFrom(pending.root, pending.gradient, pending.aux, parameter_edges);
  }
  tensors_.AfterWeightGradient(module, before);
  AfterParameterGradients(action);
}

void Executor::AfterParameterGradients(const Action& action) {
  observer_.AfterBackward(owned_parameters_);
  tensors_.SumAfterBackward(accumulator_);  // reduced-precision gradients into float32 sums
  if (after_backward_) after_backward_(action);
}

void Executor::Receive(const Action& action, StepState& state) {
  const Message message = MessageOf(action);
  state.receives[message] = transport_.Recv(SenderRank(schedule_.shape, message), message.Tag(), config_.train.device,
                                            PlannedMessage(message.microbatch, state));
}

void Executor::SendForward(const Action& action, StepState& state) {
  auto& output = Waiting(state.outputs, {action.stage, action.microbatch}, "output", transport_.rank());
  IssueSend(output.detach(), MessageOf(action), state);
  if (config_.recompute) {
    output = torch::Tensor();  // the backward makes it again; the send holds the data (on Gloo a copy)
  } else {
    ReleaseOutputData(output);  // the send holds the data until it has left (on Gloo a copy)
  }
}

void Executor::SendBackward(const Action& action, StepState& state) {
  const auto key = std::make_pair(action.stage, action.microbatch);
  const auto& gradient = Waiting(state.input_grads, key, "input gradient", transport_.rank());
  IssueSend(tensors_.InputGradientTaken(action.stage, action.microbatch, gradient), MessageOf(action), state);
  state.input_grads.erase(key);
}

void Executor::Probe(const torch::Tensor& tensor, Direction direction, int stage, int microbatch, BoundaryRole role,
                     int peer, StepState& state) {
  state.probes.push_back({state.step, microbatch, stage, direction, role, peer, reference::StartFingerprint(tensor)});
  auto values = reference::FingerprintValues(tensor);
  if (values.is_cuda()) {
    state.probe_values.push_back(values);  // read with the others at the step's end: no wait for the device now
  } else {
    // On the host the numbers are ready: read now, so no fingerprint is held (the memory meter
    // would count it against the model's prediction).
    reference::FillValues(state.probes.back().fingerprint, values);
    state.probe_values.emplace_back();
  }
}

// Messages of one (peer, direction) are consumed in the order they were sent, so the previous
// one has left before the next goes, and its buffer is released then. Deadlock-free for any
// schedule the simulator accepts under rendezvous semantics.
void Executor::IssueSend(const torch::Tensor& tensor, const Message& message, StepState& state) {
  const int peer = ReceiverRank(schedule_.shape, message);
  // The receiver posted the planned shape (a longer message would not fit its buffer): say so
  // here, at the sender, by name.
  const MessageShape planned = PlannedMessage(message.microbatch, state);
  const MessageShape sent{tensor.scalar_type(), tensor.sizes().vec()};
  TORCH_CHECK(sent == planned, "rank ", transport_.rank(), ": the ", message.ToString(), " is ", sent.ToString(),
              " but the plan expects ", planned.ToString());
  Probe(tensor, message.direction, message.stage, message.microbatch, BoundaryRole::kSent, peer, state);
  auto& in_flight = state.sends[{peer, message.direction}];
  if (in_flight) in_flight->Wait();
  in_flight = transport_.Send(tensor, peer, message.Tag(), std::nullopt);
}

void Executor::AwaitInput(const Action& action, StepState& state) {
  const auto message = InputMessage(schedule_.shape, action);
  if (!message) return;  // a local handoff, or no input to wait for
  auto received = state.receives.find(*message);
  if (received == state.receives.end()) return;  // a missing receive: TakeArrived reports it
  state.arrived[*message] = received->second->Wait();
  state.receives.erase(received);
}

torch::Tensor Executor::TakeArrived(const Action& action, StepState& state) {
  const auto message = InputMessage(schedule_.shape, action);
  auto arrived = message ? state.arrived.find(*message) : state.arrived.end();
  TORCH_CHECK(arrived != state.arrived.end(), "rank ", transport_.rank(), ": ", action.ToString(), " has no received ",
              message ? message->ToString() : "input", " (no receive was posted)");
  auto tensor = arrived->second;
  state.arrived.erase(arrived);
  return tensor;
}

void Executor::Dispatch(const Action& action, StepState& state) {
  switch (action.kind) {
    case ActionKind::kForward: return Forward(action, state);
    case ActionKind::kBackward: return Backward(action, state);
    case ActionKind::kBackwardInput: return BackwardInput(action, state);
    case ActionKind::kBackwardWeight: return BackwardWeight(action, state);
    case ActionKind::kRecvForward:
    case ActionKind::kRecvBackward: return Receive(action, state);
    case ActionKind::kSendForward: return SendForward(action, state);
    case ActionKind::kSendBackward: return SendBackward(action, state);
  }
  TORCH_CHECK(false, "rank ", transport_.rank(), ": action ", action.ToString(), " has no executor function");
}

// The step's fingerprints, their numbers read from the device at once.
void Executor::ReadProbes(StepState& state, std::vector<BoundaryRecord>& boundaries) {
  std::vector<torch::Tensor> pending;
  for (const auto& values : state.probe_values) {
    if (values.defined()) pending.push_back(values);
  }
  const auto read = pending.empty() ? torch::Tensor() : torch::stack(pending).cpu();  // (pending, 4) float64
  int64_t next = 0;
  for (size_t i = 0; i < state.probes.size(); ++i) {
    if (state.probe_values[i].defined()) reference::FillValues(state.probes[i].fingerprint, read[next++]);
    boundaries.push_back(state.probes[i]);
  }
}

double Executor::HostMicroseconds() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - clock_origin_).count();
}

Executor::ActionMarks Executor::RunAction(size_t index, StepState& state) {
  const Action& action = schedule_.ranks[transport_.rank()][index];
  ActionMarks marks;
  marks.wait = clock_.Mark();
  if (recorder_) {
    const int peer = action.IsCompute() ? InputPeer(schedule_.shape, action) : PeerOf(schedule_.shape, action);
    recorder_->Started(state.step, action.ToString(), peer, HostMicroseconds());
  }
  try {
    AwaitInput(action, state);
    marks.start = clock_.Mark();
    Dispatch(action, state);
    if (recorder_) recorder_->Ended(HostMicroseconds());
  } catch (const c10::Error& error) {
    if (!config_.train.check_host_syncs) throw;
    // Which action waited: LibTorch's own message names only the operation.
    TORCH_CHECK(false, "rank ", transport_.rank(), " step ", state.step, ": ", action.ToString(),
                " (check_host_syncs): ", error.what_without_backtrace());
  }
  marks.end = clock_.Mark();
  return marks;
}

void Executor::EndStep(StepState& state, std::vector<BoundaryRecord>& boundaries) {
  for (auto& [peer_direction, send] : state.sends) send->Wait();
  state.sends.clear();
  transport_.CheckReceived();
  ReadProbes(state, boundaries);
  TORCH_CHECK(state.receives.empty() && state.arrived.empty() && state.inputs.empty() && state.outputs.empty() &&
                  state.losses.empty() && state.aux.empty() && state.input_grads.empty() && state.weight_work.empty(),
              "rank ", transport_.rank(), " step ", state.step, " ended with work pending: ",
              state.receives.size() + state.arrived.size(), " receives, ", state.inputs.size(), " inputs, ",
              state.outputs.size(), " outputs, ", state.losses.size(), " losses, ", state.input_grads.size(),
              " gradients, ", state.weight_work.size(), " input-gradient steps (I) without their W");
}

torch::Tensor Executor::Run(int64_t step, const reference::Batch& batch, reference::StepWindow& window,
                            std::vector<ActionTiming>& timeline, std::vector<BoundaryRecord>& boundaries) {
  StepState state;
  state.step = step;
  state.batch = batch;
  state.microbatches = ReplicaMicrobatches(config_, batch);
  for (const auto& part : state.microbatches) state.replica_tokens += part.valid_tokens;
  observer_.BeginStep();
  const double step_start = HostMicroseconds();
  const auto& actions = schedule_.ranks[transport_.rank()];
  // Each action's wait, start and end as marks on the device's clock (CUDA events on a GPU: no
  // waiting for the device until the step's work has all been queued).
  std::vector<ActionMarks> marks;
  marks.reserve(actions.size());
  clock_.Clear();
  const int origin = clock_.Mark();
  const size_t first_timing = timeline.size();
  window.PeakSinceLastCall();  // each action's peak counts from what is held when it starts
  {
    // Under check_host_syncs (world size 1, nccl) the actions only queue work on a GPU: nothing
    // here may wait for it. staged copies through host memory, and waits for that by design.
    const reference::HostSyncCheck no_host_syncs(config_.train.check_host_syncs, config_.train.device);
    for (size_t index = 0; index < actions.size(); ++index) {
      observer_.BeforeAction(step, index, actions.size());
      marks.push_back(RunAction(index, state));
      if (index == last_forward_ && after_forwards_) after_forwards_(state.expert_counts);
      if (const auto end = round_ends_.find(index); end != round_ends_.end()) {
        observer_.AfterRound(end->second, owned_parameters_);
      }
      const int64_t held = window.HeldBytes();
      timeline.push_back({step, actions[index], 0.0, 0.0, held, window.PeakSinceLastCall(), 0.0, step_start});
    }
  }
  EndStep(state, boundaries);
  const double origin_us = clock_.Microseconds(origin);
  for (size_t i = 0; i < marks.size(); ++i) {
    ActionTiming& timing = timeline[first_timing + i];
    timing.wait_start_us = clock_.Microseconds(marks[i].wait) - origin_us;
    timing.start_us = clock_.Microseconds(marks[i].start) - origin_us;
    timing.end_us = clock_.Microseconds(marks[i].end) - origin_us;
  }
  last_aux_sum_ = state.aux_sum;
  last_expert_counts_ = std::move(state.expert_counts);
  last_routing_ = std::move(state.routing);
  return state.loss_sum;
}

}  // namespace pipecheck::pipeline
