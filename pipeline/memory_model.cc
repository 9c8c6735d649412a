// The memory model (see memory_model.h).
#include "pipeline/memory_model.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "pipeline/message.h"
#include "pipeline/partition.h"
#include "pipeline/transport.h"
#include "reference/data.h"
#include "reference/gradient_accumulation.h"
#include "reference/linear.h"
#include "reference/layers.h"
#include "reference/score_softmax.h"

namespace pipecheck::pipeline {
namespace {

int64_t ElementSize(torch::Dtype dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// Sizes that do not change with the microbatch.
struct Sizes {
  reference::ModelConfig model;
  int64_t e = 4;     // parameter and activation element
  int64_t s = 4;     // norm statistics (float32 at least)
  int64_t loss = 4;  // logits as the loss sees them (float32 at least)
  int64_t grad = 4;  // an accumulated gradient element (fp32 sums under reduced precision)
  int64_t router = 4;  // a mixture of experts' router element (reference::RouterDtype)
  bool adamw = true;
  // Which products run on oneDNN (reference/linear.h): the (h, h) projections, the MLP's (h, ffn)
  // weights, the head's (h, vocab). A later backward adds such a layer's weight gradient into
  // .grad in place (reference::FusedWeightGradients): no fresh gradient for it.
  bool projections_on_onednn = false;
  bool mlp_on_onednn = false;
  bool head_on_onednn = false;
  // Every layer's attention saves the stage's one (b, 1, t, t) keep mask, not a negated copy of
  // its own (reference/score_softmax.h).
  bool mask_shared = false;
};

Sizes SizesOf(const PipelineConfig& config) {
  Sizes sizes;
  sizes.model = config.train.model;
  sizes.e = ElementSize(config.train.dtype);
  sizes.s = config.train.dtype == torch::kFloat64 ? 8 : 4;
  sizes.loss = sizes.s;
  sizes.grad = reference::AccumulatesInFloat32(config.train.dtype) ? 4 : sizes.e;
  sizes.router = ElementSize(reference::RouterDtype(config.train.dtype));
  sizes.adamw = config.train.optimizer.kind == reference::OptimizerKind::kAdamW;
  sizes.projections_on_onednn = reference::LinearOnOneDnn(config.train.dtype, config.train.device,
                                                          sizes.model.hidden, sizes.model.hidden);
  sizes.mlp_on_onednn = reference::LinearOnOneDnn(config.train.dtype, config.train.device, sizes.model.hidden,
                                                  sizes.model.FfnSize());
  sizes.head_on_onednn = reference::LinearOnOneDnn(config.train.dtype, config.train.device, sizes.model.hidden,
                                                   sizes.model.vocab);
  sizes.mask_shared = reference::MaskedSoftmaxFusedFor(config.train.dtype, config.train.device);
  return sizes;
}

bool IsLlama(const Sizes& z) { return z.model.flavor == reference::Flavor::kLlama; }

// Bytes one microbatch (b sequences, t positions) leaves saved on a stage until its backward.
enum class Input { kTokens, kReceived, kLocal };  // stage 0; from another rank; from this rank's previous stage

// What the head (final norm, projection, loss) keeps for a microbatch of n tokens.
int64_t HeadRetained(const Sizes& z, int64_t n) {
  const int64_t h = z.model.hidden;
  return (2 * z.e + z.s) * n * h + z.loss * n * z.model.vocab + z.s * n + 8;
}

// What one layer keeps for its backward: each norm (RMSNorm and LayerNorm alike) one (n, h)
// statistics-precision tensor beside its output (LibTorch 1.13 kept one more for RMSNorm and two
// more for LayerNorm; LibTorch 2.11's counts measured exact on both flavours in three dtypes).
int64_t PerLayerRetained(const Sizes& z, int64_t b, int64_t t) {
  const int64_t n = b * t, h = z.model.hidden, f = z.model.FfnSize(), heads = z.model.heads;
  const bool llama = IsLlama(z);
  return (8 * z.e + 2 * z.s) * n * h + (llama ? 4 : 2) * z.e * n * f + z.e * b * heads * t * t +
         (z.mask_shared ? 0 : b * t * t) +
         2 * z.s * n;
}

// What a dense MLP keeps: its hidden-sized activations (its input is counted with the norm's).
int64_t DenseMlpRetained(const Sizes& z, int64_t n) { return (IsLlama(z) ? 4 : 2) * z.e * n * z.model.FfnSize(); }

// What layer `layer`'s feed-forward keeps for its backward, for a microbatch of b sequences of t
// positions of which `tokens` lie within their sequences' lengths. A mixture of experts
// (reference/layers.cc) keeps, with r the router's element size (float32, float64 for float64
// models) and N = b·t:
//   router: under reduced precision its float32 input (N, h) and weight (E, h) copies (the
//     norm's output in the model's dtype, kept by nothing else then, goes); the
//     scores (N, E); the sort's indices (N, E) int64, whose top-k view the gather keeps; the
//     chosen scores (N, k) and their sum (N) for the gates' division (a sigmoid router also its
//     scores' sum (N) for the balance loss's normalisation);
//   per dispatched slot (k per token within its length; padding is not dispatched): its token's
//     and its slot's int64 indices, the expert's input row (h), the llama MLP's four ffn-sized
//     rows, its output row and its gate (the gate's product saves both), and the gated row
//     (h), which index_add keeps;
//   a shared expert: a dense llama MLP of expert_ffn over every position;
//   the balance loss: the valid-position mask (N) and f (b, E) in r, per layer.
// Measured on LibTorch 2.15's CPU allocator: exact to 24 bytes a microbatch in float32 and
// float64, and to 10 bytes a layer in bfloat16.
int64_t MlpRetained(const Sizes& z, int64_t layer, int64_t b, int64_t t, int64_t tokens) {
  const int64_t n = b * t;
  const auto& model = z.model;
  if (!model.IsMoeLayer(layer)) return DenseMlpRetained(z, n);
  const int64_t h = model.hidden, experts = model.experts, k = model.top_k, f = model.ExpertFfnSize();
  const int64_t r = z.router, index = 8;
  int64_t bytes = r * n * experts + index * n * experts + r * n * k + r * n;
  if (r != z.e) bytes += r * n * h + r * experts * h - z.e * n * h;
  if (model.router == reference::Router::kSigmoid && model.aux_loss > 0.0) bytes += r * n;
  bytes += k * tokens * (2 * index + 3 * h * z.e + 4 * f * z.e + z.e);
  if (model.shared_experts > 0) bytes += 4 * z.e * n * f;
  if (model.aux_loss > 0.0) bytes += r * n + r * b * experts;
  return bytes;
}

int64_t LayerRetained(const Sizes& z, int64_t layer, int64_t b, int64_t t, int64_t tokens) {
  return PerLayerRetained(z, b, t) - DenseMlpRetained(z, b * t) + MlpRetained(z, layer, b, t, tokens);
}

int64_t Retained(const Sizes& z, const reference::SliceSpec& slice, Input input, int64_t b, int64_t t, int64_t tokens) {
  const int64_t n = b * t, h = z.model.hidden;
  const int64_t layers = slice.end_layer - slice.first_layer;
  const bool llama = IsLlama(z);
  int64_t bytes = 0;
  if (layers > 0) {
    for (int64_t layer = slice.first_layer; layer < slice.end_layer; ++layer) bytes += LayerRetained(z, layer, b, t, tokens);
    if (llama) bytes += 2 * t * z.model.HeadDim() * z.e;  // rotary cos and sin tables
    if (z.mask_shared) bytes += b * t * t;                 // the attention's keep mask, shared
    // The stage's balance-loss terms, summed into one 0-dim tensor kept for the backward.
    if (z.model.aux_loss > 0.0 && z.model.MoeLayersIn(slice.first_layer, slice.end_layer) > 0) bytes += z.router;
  }
  if (slice.has_embedding && !llama) bytes += t * 8;  // position indices
  if (slice.has_head) bytes += HeadRetained(z, n);
  // A received input is held as the stage's leaf. RMSNorm saves its input itself when it
  // computes in the input's own precision (then it is already counted above); under bfloat16 it
  // saves an fp32 copy instead, and the input is extra. LayerNorm saves only the centred input,
  // a tensor of its own, so under gpt2 the input is always extra.
  const bool saved_by_first_norm = llama && z.e == z.s && (layers > 0 || slice.has_head);
  if (input == Input::kReceived && !saved_by_first_norm) bytes += n * h * z.e;
  // A local input is the previous stage's output, counted there.
  if (input == Input::kLocal && saved_by_first_norm) bytes -= n * h * z.e;
  return bytes;
}

// What a split backward's I leaves for its W, per layer (the executor plans W from the nodes where
// each weight's gradient path leaves the input's, and frees everything else as I passes it):
// what those nodes saved, and the gradients I captured flowing into them. Both flavours save five
// (n, h) tensors (each norm's normalised input and its output, the output projection's input)
// and the second MLP matrix's (n, ffn) input; they capture the gradients of both norms' outputs,
// of the query, key and value projections, of the attention's output (the residual's), of the
// MLP's hidden-sized products (two for llama's gated pair) and of the layer's output (the
// next layer's input gradient, or the stage's output gradient, held anyway). A mixture of experts
// keeps, for its feed-forward, the router's input (its float32 copies and the weight's under
// reduced precision), each expert's input rows and gated product, the router logits' gradient
// and each expert's three projections' output gradients; its layer output's gradient only where a
// shared expert's last projection captures it.
bool CapturesLayerOutputGradient(const Sizes& z, int64_t layer) {
  return !z.model.IsMoeLayer(layer) || z.model.shared_experts > 0;
}

// gpt2 keeps one (n, h) tensor a layer more than this count explains where its (h, h) projections
// run ATen's product (measured, LibTorch 2.15), and none where they run oneDNN's (measured on
// gpt2 hidden 128 in float32: the held bytes after I fall by exactly one (n, h) a layer).
int64_t LayerWeightKept(const Sizes& z, int64_t layer, int64_t b, int64_t t, int64_t tokens) {
  const auto& model = z.model;
  const int64_t n = b * t, h = model.hidden, kv = model.KvWidth();
  // What the weights' nodes saved: the first norm's two, the output projection's input.
  int64_t saved = (3 + (IsLlama(z) || z.projections_on_onednn ? 0 : 1)) * n * h * z.e;
  int64_t captured = (3 * h + 2 * kv) * n * z.e + (CapturesLayerOutputGradient(z, layer) ? n * h * z.e : 0);
  if (!model.IsMoeLayer(layer)) {
    const int64_t f = model.FfnSize(), products = IsLlama(z) ? 2 : 1;
    saved += (2 * h + f) * n * z.e;
    captured += (h + products * f) * n * z.e;
    return saved + captured;
  }
  const int64_t f = model.ExpertFfnSize(), k = model.top_k, experts = model.experts, r = z.router;
  saved += n * h * z.e;                                              // the second norm's normalised input
  saved += r == z.e ? n * h * z.e : r * n * h + r * experts * h;     // the router's input (and weight copy)
  saved += k * tokens * (h + f) * z.e;                               // each expert's rows and product
  captured += n * h * z.e + r * n * experts + k * tokens * (2 * f + h) * z.e;
  if (model.shared_experts > 0) {
    saved += (r == z.e ? 0 : n * h * z.e) + f * n * z.e;
    captured += 2 * f * n * z.e;
  }
  return saved + captured;
}

// A stage's: its layers', the head's (the final norm's normalised input and output, their
// gradient and the logits'), and a received input (its accumulator, held by the graph W walks);
// a stage without the head captures its output's gradient, which the model holds for W already.
int64_t WeightKept(const Sizes& z, const reference::SliceSpec& slice, Input input, int64_t b, int64_t t,
                   int64_t tokens) {
  const int64_t n = b * t, h = z.model.hidden;
  int64_t bytes = input == Input::kReceived ? n * h * z.e : 0;
  for (int64_t layer = slice.first_layer; layer < slice.end_layer; ++layer) {
    bytes += LayerWeightKept(z, layer, b, t, tokens);
  }
  if (slice.has_head) {
    bytes += (3 * h + z.model.vocab) * n * z.e;
  } else if (slice.end_layer > slice.first_layer && CapturesLayerOutputGradient(z, slice.end_layer - 1)) {
    bytes -= n * h * z.e;
  }
  return bytes;
}

// A split I frees what each node saved as it passes it and holds the gradients it captures. On a
// stage with layers it peaks in the last layer's MLP, where llama's gated product holds three
// ffn-sized gradients at once (gpt2's GELU two, beside an (n, h) one), or, over long sequences,
// at its attention, two score-sized gradients beside what it holds. A stage with the head also
// holds the final norm's input gradient there (statistics precision), and peaks first at its
// logits' two gradients (in the loss's precision). Measured on llama and gpt2
// in float64, float32 and bfloat16, hidden 32..256, 32..256 tokens a microbatch: exact to 1% on
// stages of dense layers.
int64_t SplitInputTransient(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t) {
  const int64_t n = b * t, h = z.model.hidden;
  const int64_t f = z.model.IsMoeLayer(slice.end_layer - 1) ? z.model.ExpertFfnSize() : z.model.FfnSize();
  const int64_t scores = z.e * b * z.model.heads * t * t;
  const int64_t mlp = IsLlama(z) ? 3 * n * f * z.e : 2 * n * f * z.e + n * h * z.e;
  const int64_t logits = slice.has_head ? 2 * z.loss * n * z.model.vocab : 0;  // the head's two, first
  return std::max({2 * scores, mlp + (slice.has_head ? n * h * z.s : 0), logits});
}

// A split W runs one weight's (or a few weights') gradient at a time from what I captured, in the
// stage's parameter order (a tied head's copy of the embedding first, then the layers, the final
// norm and the projection), freeing what each node saved and the gradients it was handed once it
// has run. A norm weight's gradient holds an (n, h) product before summing it over the tokens; a
// matrix's is a fresh gradient of its size, added into the existing one (`creates`: made, and
// staying, in a first backward, or every one under reduced precision). Modelled a layer at a
// time; exact on head stages (the projection's gradient against what went before it).
int64_t SplitWeightTransient(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t, int64_t tokens,
                             bool creates) {
  const int64_t n = b * t, h = z.model.hidden, vocab = z.model.vocab, moment = n * h * z.e;
  const bool tied_head = slice.has_head && z.model.tied;
  const bool head_fresh = creates || !z.head_on_onednn;  // a later W adds a oneDNN head's gradient in place
  int64_t running = 0, bytes = 0;  // made less freed so far; the most above where W began
  const auto reach = [&](int64_t transient) { bytes = std::max(bytes, running + transient); };
  if (tied_head) {
    if (head_fresh) reach(vocab * h * z.e);
    running += (creates ? vocab * h * z.e : 0) - n * vocab * z.e;  // the logits' gradient goes
  }
  for (int64_t layer = slice.first_layer; layer < slice.end_layer; ++layer) {
    reach(moment);
    running += (creates ? z.model.LayerParameterCount(layer) * z.e : 0) - LayerWeightKept(z, layer, b, t, tokens);
    if (creates) reach(moment);
  }
  if (slice.has_head) {
    reach(moment);  // the final norm's
    running += (creates ? (z.model.HeadParameterCount() - vocab * h) * z.e : 0) - 2 * n * h * z.e;
    if (!tied_head && head_fresh) reach(vocab * h * z.e);
  }
  return bytes;
}

// What a layer saves after its attention's scores are gone (a lower bound): the MLP's saved
// activations, the hidden-sized inputs of the output projection and of the MLP, and the second
// norm's statistics-precision and output tensors (large beside the rest under bfloat16, where
// the statistics are fp32). On a stage's last layer, a forward saves these (and the head's, when
// the stage has the head) only after the score transient has passed; a backward frees them
// before it reaches the scores. SavedAfterScores adds the head's where the stage has it.
// The stage's last layer's, whose feed-forward may be a mixture of experts (MlpRetained).
int64_t LayerSavedAfterScores(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t, int64_t tokens) {
  const int64_t n = b * t, h = z.model.hidden;
  return MlpRetained(z, slice.end_layer - 1, b, t, tokens) + 2 * h * n * z.e + (z.s + z.e) * n * h;
}
int64_t SavedAfterScores(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t, int64_t tokens) {
  return LayerSavedAfterScores(z, slice, b, t, tokens) + (slice.has_head ? HeadRetained(z, b * t) : 0);
}

// Extra bytes alive for a moment inside a forward or backward (above what it leaves behind).
// A forward's attention holds two score-sized tensors at once (the scaled scores and the masked
// ones, before the softmax), of which the softmax's output stays saved: one score above what the
// forward has saved so far, which is all it leaves behind but the last layer's SavedAfterScores.
// Besides, a stage with layers holds for a moment, beside all it keeps, the microbatch's mask and
// a few (n, h) tensors: two of the model dtype for gpt2 (its LayerNorm's elementwise chain), one
// for llama (its RMSNorm's, statistics-sized under bfloat16), and one more where the first
// stage adds position embeddings (gpt2) or casts the embedding's output (llama under bfloat16).
// Measured on LibTorch 2.11's CPU allocator: exact on 40 forwards of both flavours in float32,
// float64 and bfloat16, first and middle stages, hidden 64..256, 16..128 positions.
int64_t ForwardTransient(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t, int64_t tokens) {
  int64_t bytes = 0;
  if (slice.end_layer > slice.first_layer) {
    const int64_t n = b * t, h = z.model.hidden;
    const bool llama = IsLlama(z);
    const int64_t tail = b * t * t + (llama ? (z.e == z.s ? z.e : z.s) : 2 * z.e) * n * h +
                         (slice.has_embedding && (!llama || z.e != z.s) ? z.e * n * h : 0);
    bytes = std::max<int64_t>(tail, z.e * b * z.model.heads * t * t - SavedAfterScores(z, slice, b, t, tokens));
  }
  if (slice.has_head) {
    const int64_t n = b * t, h = z.model.hidden;
    const int64_t logits = n * z.model.vocab * (z.e + (z.loss != z.e ? z.loss : 0));
    // gpt2's final LayerNorm, composed of elementwise ops in statistics precision, passes about
    // three quarters of an (n, h) statistics tensor above what it keeps (and the cast back under
    // bfloat16); llama's RMSNorm stays below its logits (measured on head-only stages).
    const int64_t norm = IsLlama(z) ? 0 : 3 * z.s * n * h / 4 + (z.e != z.s ? z.e * n * h : 0);
    bytes = std::max({bytes, logits, norm});
  }
  return bytes;
}

// A forward without its graph (recompute=1) frees each op's inputs as it goes: at its height it
// holds one attention's scores beside their softmax (and the mask), or an MLP's hidden-sized
// products; the head holds its logits and their log-softmax in the loss dtype. An estimate:
// the recomputing backward, not this, sets a recomputing rank's peak.
int64_t GraphlessForwardTransient(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t) {
  const int64_t n = b * t, h = z.model.hidden, f = z.model.FfnSize();
  int64_t bytes = 0;
  if (slice.end_layer > slice.first_layer) {
    const int64_t scores = z.e * b * z.model.heads * t * t;
    bytes = std::max(2 * scores + b * t * t + 2 * n * h * z.e, ((IsLlama(z) ? 3 : 2) * f + 2 * h) * n * z.e);
  }
  if (slice.has_head) {
    bytes = std::max(bytes, n * h * z.e + 2 * n * z.model.vocab * std::max(z.e, z.loss));
  }
  return bytes;
}

// Which part of a backward an action runs: both (B), the input's gradient (I), the weights' (W).
enum class Pass { kFull, kInput, kWeight };

// At the attention, two score-sized gradients are alive at once (the softmax's incoming and
// outgoing ones), with the value's and the residual's gradients. An input-gradient pass (I)
// keeps every saved tensor for W, so nothing it passes is freed. B and W free as they go: the
// head's saved tensors before the layers, the last layer's SavedAfterScores before its scores.
// `accumulates`: the parameters' gradients exist already (a later backward, in their own dtype),
// so each fresh one is a temporary beside the activation gradients of its op until it is added
// in place: the largest weight of each part counts once; a layer on oneDNN adds its product
// straight into .grad (Sizes::projections_on_onednn, mlp_on_onednn, head_on_onednn): none.
// Otherwise (a first backward; under bfloat16 every backward, before the fp32 sums) each gradient
// B or W makes stays, so the gradients made so far stand beside each op's: the head's at the last
// layer's MLP, which holds its second weight's beside one ffn-sized gradient (two for llama's gated
// product; the gradient of gpt2's GELU replaces its input's, freed, where an I keeps both), and the
// MLP's and the attention's at the attention's end, where what the MLP saved is gone. A stage of
// many layers whose gradients outweigh what each layer saved (few tokens beside a wide hidden)
// grows layer by layer and peaks at its first layer.
// The embedding table's gradient comes last, once the layers' saved tensors (`retained`, all
// this microbatch keeps on the stage) are released.
int64_t BackwardTransient(const Sizes& z, const reference::SliceSpec& slice, int64_t b, int64_t t, int64_t tokens, Pass pass,
                          bool accumulates, int64_t retained, int64_t recomputed) {
  const int64_t n = b * t, h = z.model.hidden, f = z.model.FfnSize(), vocab = z.model.vocab;
  const bool llama = IsLlama(z), keeps_graph = pass == Pass::kInput;
  const bool creates = !keeps_graph && !accumulates;  // gradients made now stay until the step ends
  const int64_t fresh = accumulates ? z.e : 0;       // per element of a fresh parameter gradient
  const int64_t fresh_mlp = z.mlp_on_onednn ? 0 : fresh, fresh_attention = z.projections_on_onednn ? 0 : fresh;
  const int64_t layers = slice.end_layer - slice.first_layer;
  int64_t bytes = 0;
  if (layers > 0) {
    const int64_t scores = z.e * b * z.model.heads * t * t;
    // Before the layers, B and W free the head's saved tensors and make its gradients.
    const int64_t head = slice.has_head && !keeps_graph ? HeadRetained(z, n) : 0;
    const int64_t head_grads = creates && slice.has_head ? z.model.HeadParameterCount() * z.e : 0;
    const int64_t mlp_params = llama ? 3 * h * f : 2 * h * f + f + h;
    // The head's output gradient flows past the MLP on the residual path while it runs.
    const int64_t residual = slice.has_head ? n * h * z.e : 0;
    const int64_t at_mlp =
        keeps_graph ? 2 * n * f * z.e + residual
        : creates   ? head_grads - head + residual + h * f * z.e + (llama ? 2 : 1) * n * f * z.e
        : llama     ? residual - head + std::max(fresh_mlp * h * f + n * f * z.e, 2 * n * f * z.e)
                    : residual - head + fresh_mlp * h * f + n * f * z.e;
    const int64_t mlp_freed = keeps_graph ? 0 : LayerSavedAfterScores(z, slice, b, t, tokens);
    const int64_t attention_weight = creates ? head_grads + (mlp_params + h * h) * z.e : fresh_attention * h * h;
    const int64_t at_scores = 2 * scores + 2 * n * h * z.e - mlp_freed - head + attention_weight;
    bytes = std::max({int64_t{0}, at_mlp, at_scores});
    if (creates) {
      const int64_t layer_grads = z.model.LayerParameterCount(slice.end_layer - 1) * z.e;
      const int64_t growth =
          std::max<int64_t>(0, layer_grads - LayerRetained(z, slice.end_layer - 1, b, t, tokens)) * (layers - 1);
      bytes = std::max(bytes, head_grads - head + layer_grads - mlp_freed + growth);
    }
  }
  // W recomputes the input's gradient first; what the layers add comes on top of it.
  bytes += recomputed;
  if (slice.has_head) {
    // Three moments, measured on head-only stages (vocab 32..512, hidden 64..256, 8..128 tokens):
    // the log-softmax's and the logits' gradients; the output projection's backward, its
    // weight's gradient (fresh, or made now and staying) beside its input's, the largest where
    // few tokens meet a wide vocabulary; the final norm's backward, a chain of elementwise ops in
    // statistics precision. I keeps every tensor those ops saved and holds five (n, h) gradients
    // at its height; B has freed the logits' by then but holds three, a fourth under reduced
    // precision (the cast's) (LibTorch 2.11; 1.13 held two beside the loss's (n, vocab) gradient);
    // W recomputes the input's gradient and needs a quarter of an (n, h) beside it. The norm's
    // own weights' gradients, where a first backward makes them, stand beside its peak; the
    // projection's were not seen there.
    const int64_t logits = 2 * z.loss * n * vocab;
    const int64_t norm_made = creates ? (z.model.HeadParameterCount() - vocab * h) * z.e : 0;
    const bool projection_fresh = !keeps_graph && !(accumulates && z.head_on_onednn);  // made, or added to .grad
    const int64_t projection = (projection_fresh ? vocab * h * z.e : 0) + n * h * z.e;
    const int64_t norm = pass == Pass::kInput ? 5 * z.s * n * h
                         : pass == Pass::kFull
                             ? norm_made + (z.e != z.s ? 4 : 3) * z.s * n * h
                             : norm_made + recomputed + n * h * z.e / 4;
    bytes = std::max({bytes, logits, projection, norm});
  }
  if (slice.has_embedding && accumulates) {
    const int64_t released = slice.end_layer > slice.first_layer || slice.has_head ? retained : 0;
    bytes = std::max(bytes, fresh * vocab * h + n * h * z.e - released);
  }
  return bytes;
}

// The largest single parameter of a stage (optimizer and clipping temporaries are per parameter).
// Clipping does not square the last stage's copy of a tied weight (its owner on stage 0 does):
// `clipped` leaves that copy out.
int64_t LargestParameter(const reference::ModelConfig& model, const reference::SliceSpec& slice, bool clipped = false) {
  int64_t largest = slice.has_head ? model.hidden : 0;  // the final norm
  if (slice.end_layer > slice.first_layer) largest = std::max(model.hidden * model.hidden, model.hidden * model.FfnSize());
  const bool tied_copy = model.tied && slice.has_head && !slice.has_embedding;
  if (slice.has_embedding || (slice.has_head && !(clipped && tied_copy))) {
    largest = std::max(largest, model.vocab * model.hidden);
  }
  if (slice.has_embedding && model.flavor == reference::Flavor::kGpt2) largest = std::max(largest, model.max_seq_len * model.hidden);
  return largest;
}

// One rank's step through its action list, mirroring the executor: one method per action kind,
// each moving `held` as the executor's tensors come and go, and noting the most held during the
// action (its transients on top).
class RankWalk {
 public:
  RankWalk(const Sizes& z, const std::vector<reference::SliceSpec>& slices, const PipelineShape& shape,
           const std::vector<MicrobatchShape>& parts, int64_t held, bool recompute)
      : z_(z), slices_(slices), shape_(shape), parts_(parts), held_(held), recompute_(recompute) {}

  // Walks `actions`, appending the bytes held after each and the most held during it.
  void Run(const std::vector<Action>& actions, std::vector<int64_t>& held_after, std::vector<int64_t>& peak_during) {
    for (const Action& a : actions) {
      action_peak_ = held_;
      switch (a.kind) {
        case ActionKind::kRecvForward:
        case ActionKind::kRecvBackward: Receive(a); break;
        case ActionKind::kForward: Forward(a); break;
        case ActionKind::kSendForward:
        case ActionKind::kSendBackward: Send(a); break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
        case ActionKind::kBackwardWeight: Backward(a); break;
      }
      held_after.push_back(held_);
      peak_during.push_back(std::max(action_peak_, held_));
      peak_ = std::max(peak_, peak_during.back());
    }
    for (auto& [key, bytes] : in_flight_) held_ -= bytes;  // every send completes by step end
  }

  int64_t held() const { return held_; }
  int64_t peak() const { return peak_; }

 private:
  using StageMicrobatch = std::pair<int, int>;
  using SendKey = std::pair<int, int>;  // (peer, send kind)

  void Reach(int64_t bytes) { action_peak_ = std::max(action_peak_, bytes); }
  // One boundary message of microbatch `mb`: (b, t, hidden).
  int64_t MessageBytes(int mb) const { return parts_[mb].sequences * parts_[mb].time * z_.model.hidden * z_.e; }
  // Where stage `stage`'s input for microbatch `mb` comes from.
  Input InputOf(int stage, int mb) const {
    if (stage == 0) return Input::kTokens;
    return InputMessage(shape_, {ActionKind::kForward, stage, mb}).has_value() ? Input::kReceived : Input::kLocal;
  }
  bool Passthrough(const reference::SliceSpec& slice) const {
    return slice.end_layer == slice.first_layer && !slice.has_embedding && !slice.has_head;
  }

  // A receive is posted with its buffer: the header and the planned payload (one buffer on Gloo).
  void Receive(const Action& a) {
    held_ += MessageBytes(a.microbatch) + kMessageHeaderBytes;
    Reach(held_);
  }

  // The received buffer (counted at RECV) is copied out as the stage's input and goes.
  void Forward(const Action& a) {
    const auto& slice = slices_[a.stage];
    const int mb = a.microbatch;
    const int64_t b = parts_[mb].sequences, t = parts_[mb].time, tokens = parts_[mb].tokens;
    const Input input = InputOf(a.stage, mb);
    const bool remote_input = input == Input::kReceived;
    if (remote_input) Reach(held_ + MessageBytes(mb));
    // Recomputation keeps the input alone (a received one; the tokens and a local input are held
    // anyway) and builds no graph: its forward holds only what one op at a time makes.
    const int64_t kept = recompute_ ? (input == Input::kReceived ? MessageBytes(mb) : 0) : Retained(z_, slice, input, b, t, tokens);
    const int64_t output = slice.has_head || Passthrough(slice) ? 0 : MessageBytes(mb);
    held_ += kept + output - (remote_input ? MessageBytes(mb) + kMessageHeaderBytes : 0);
    Reach(held_ + (recompute_ ? GraphlessForwardTransient(z_, slice, b, t) : ForwardTransient(z_, slice, b, t, tokens)));
    retained_[{a.stage, mb}] = kept + output;
  }

  // recompute=1: a B or I first runs the stage's forward again from its kept input, saving what
  // a forward with its graph saves (Retained, less the input held already) and making the output
  // again (the backward's root, held until it ends), with the forward's transient on top.
  void Recompute(const Action& a) {
    const auto& slice = slices_[a.stage];
    const int mb = a.microbatch;
    const int64_t b = parts_[mb].sequences, t = parts_[mb].time, tokens = parts_[mb].tokens;
    const Input input = InputOf(a.stage, mb);
    const int64_t saved = Retained(z_, slice, input, b, t, tokens) - (input == Input::kReceived ? MessageBytes(mb) : 0);
    const int64_t root = slice.has_head || Passthrough(slice) ? 0 : MessageBytes(mb);
    held_ += saved + root;
    retained_[{a.stage, mb}] += saved + root;
    Reach(held_ + ForwardTransient(z_, slice, b, t, tokens));
  }

  // The previous message to this peer and direction has left; the data is copied into the send's
  // buffer (its header and payload) and the tensor goes, unless it is a passthrough's output: its
  // input, still held.
  void Send(const Action& a) {
    const int mb = a.microbatch;
    const bool forward = a.kind == ActionKind::kSendForward;
    const bool passthrough = Passthrough(slices_[a.stage]);
    const SendKey key{PeerOf(shape_, a), static_cast<int>(a.kind)};
    auto& buffer = in_flight_[key];
    held_ -= buffer;
    buffer = MessageBytes(mb) + kMessageHeaderBytes;
    Reach(held_ + buffer);  // the copy, beside the tensor it copies
    const int64_t moved = forward && passthrough ? 0 : MessageBytes(mb);
    held_ += buffer - moved;
    if (forward) {
      retained_[{a.stage, mb}] -= moved;
    } else {
      pending_grad_.erase({a.stage, mb});
    }
    Reach(held_);
  }

  // B is I then W at once. I hands the input gradient on and keeps the graph (and the output
  // gradient it started from) for W; W frees them and creates the parameters'.
  void Backward(const Action& a) {
    const auto& slice = slices_[a.stage];
    const int mb = a.microbatch;
    const int64_t b = parts_[mb].sequences, t = parts_[mb].time, tokens = parts_[mb].tokens;
    const bool passthrough = Passthrough(slice);
    const bool input_part = a.kind != ActionKind::kBackwardWeight;
    const bool weight_part = a.kind != ActionKind::kBackwardInput;
    // Where the output gradient comes from: another rank (a message), this rank's next stage, or
    // the loss (the head).
    const bool remote_gradient = InputMessage(shape_, {ActionKind::kBackwardInput, a.stage, mb}).has_value();
    const bool local_gradient = a.stage + 1 < shape_.stages() && !remote_gradient && !slice.has_head;
    // A received gradient is copied out of its buffer (header and payload), which goes.
    if (remote_gradient && input_part) {
      Reach(held_ + MessageBytes(mb));
      held_ -= kMessageHeaderBytes;
    }
    const int64_t gradient_in = remote_gradient ? MessageBytes(mb) : 0;
    // A passthrough hands its output gradient on as its input gradient.
    const int64_t input_gradient = a.stage == 0 || passthrough ? 0 : MessageBytes(mb);
    // Stage 0's I has no input gradient to compute, and an empty stage nothing at all (its W
    // recomputes nothing either): they run nothing.
    const bool runs = !passthrough && (a.kind != ActionKind::kBackwardInput || a.stage > 0);
    if (recompute_ && input_part && !passthrough) Recompute(a);
    const bool accumulates = z_.grad == z_.e && has_gradients_.count(a.stage) > 0;
    // A split backward's I and W: on a stage with layers past the first, I plans W (executor.cc);
    // stage 0's I runs nothing (its W is a whole backward), a head-only stage's I keeps the graph.
    const bool split = a.kind != ActionKind::kBackward && a.stage > 0 && slice.end_layer > slice.first_layer;
    // An unplanned W recomputes the input's gradient where its weights need it.
    const int64_t recomputed = a.kind == ActionKind::kBackwardWeight && a.stage > 0 && !split ? MessageBytes(mb) : 0;
    if (runs && split) {
      Reach(held_ + (input_part ? SplitInputTransient(z_, slice, b, t)
                                : SplitWeightTransient(z_, slice, b, t, tokens, !accumulates)));
    } else if (runs) {
      const Pass pass = !weight_part ? Pass::kInput : input_part ? Pass::kFull : Pass::kWeight;
      Reach(held_ + BackwardTransient(z_, slice, b, t, tokens, pass, weight_part && accumulates, retained_[{a.stage, mb}],
                                      recomputed));
    }
    if (input_part) InputPart(a, passthrough, local_gradient, gradient_in, input_gradient);
    if (a.kind == ActionKind::kBackwardInput && runs && split) Split(a);
    if (weight_part) WeightPart(a, passthrough, local_gradient, gradient_in);
  }

  // A split I leaves only what its W needs (WeightKept): the rest of what the forward saved goes,
  // and, recomputing, the output made again; a stage whose output's gradient no layer captures
  // lets that go too.
  void Split(const Action& a) {
    const StageMicrobatch here{a.stage, a.microbatch};
    const auto& slice = slices_[a.stage];
    const int mb = a.microbatch;
    const int64_t b = parts_[mb].sequences, t = parts_[mb].time, tokens = parts_[mb].tokens;
    const Input input = InputOf(a.stage, mb);
    const int64_t root = recompute_ && !slice.has_head ? MessageBytes(mb) : 0;
    const int64_t released =
        Retained(z_, slice, input, b, t, tokens) - WeightKept(z_, slice, input, b, t, tokens) + root;
    held_ -= released;
    retained_[here] -= released;
    if (!slice.has_head && !CapturesLayerOutputGradient(z_, slice.end_layer - 1)) {
      held_ -= held_for_weight_[here];
      held_for_weight_[here] = 0;
    }
  }

  void InputPart(const Action& a, bool passthrough, bool local_gradient, int64_t gradient_in, int64_t input_gradient) {
    const StageMicrobatch here{a.stage, a.microbatch};
    held_ += input_gradient;
    if (a.stage > 0) pending_grad_[here] = passthrough ? gradient_in : input_gradient;
    if (a.kind != ActionKind::kBackwardInput) return;
    if (passthrough) {
      // An empty stage's W runs nothing and keeps nothing: its input goes at I (the send of its
      // output, the same tensor, copied it).
      held_ -= retained_[here];
      retained_.erase(here);
    }
    // What W still needs: the graph, the output gradient (and W recomputes the input's).
    held_for_weight_[here] = passthrough ? 0 : gradient_in;
    if (local_gradient) {
      held_for_weight_[here] += pending_grad_[{a.stage + 1, a.microbatch}];
      pending_grad_.erase({a.stage + 1, a.microbatch});
    }
  }

  void WeightPart(const Action& a, bool passthrough, bool local_gradient, int64_t gradient_in) {
    const StageMicrobatch here{a.stage, a.microbatch};
    const auto& slice = slices_[a.stage];
    const int64_t stage_params = StageParameterCount(z_.model, slice);
    const bool first_backward = has_gradients_.insert(a.stage).second;
    const int64_t grads = first_backward ? stage_params * z_.grad : 0;
    // Reduced precision: each backward's gradients arrive in the parameter dtype and are converted
    // one parameter at a time to fp32 and added to the sums (the first backward's conversions
    // become the sums).
    const int64_t largest_here = LargestParameter(z_.model, slice);
    const int64_t conversion = z_.grad == z_.e ? 0
                               : first_backward ? largest_here * z_.e
                                                : stage_params * z_.e + largest_here * z_.grad;
    if (a.kind == ActionKind::kBackwardWeight) {
      held_ -= held_for_weight_[here];
      held_for_weight_.erase(here);
    } else {
      held_ -= passthrough ? 0 : gradient_in;
      if (local_gradient) {
        held_ -= pending_grad_[{a.stage + 1, a.microbatch}];
        pending_grad_.erase({a.stage + 1, a.microbatch});
      }
    }
    held_ += grads - retained_[here];
    retained_.erase(here);
    Reach(held_ + conversion);
  }

  const Sizes& z_;
  const std::vector<reference::SliceSpec>& slices_;
  const PipelineShape& shape_;
  const std::vector<MicrobatchShape>& parts_;
  int64_t held_ = 0;
  bool recompute_ = false;
  int64_t peak_ = 0;
  int64_t action_peak_ = 0;
  std::set<int> has_gradients_;                          // stages whose gradients exist this step
  std::map<StageMicrobatch, int64_t> retained_;          // bytes kept until the backward
  std::map<StageMicrobatch, int64_t> pending_grad_;      // input gradient waiting for SEND_B (or the next stage)
  std::map<StageMicrobatch, int64_t> held_for_weight_;   // I done: output gradients kept for W
  std::map<SendKey, int64_t> in_flight_;                 // send buffer bytes per (peer, direction)
};

// After the actions: clipping takes each gradient's squared sum in float64 (a tied weight's two
// gradients summed first, the peer's copy received), AdamW makes two temporaries per parameter,
// and the first step creates its state. Returns the step's peak from `peak` on.
// With several replicas, the first step's average across them (after the tied sum, before the
// clip) allocates a flat bucket of every gradient of the rank, `replica_bucket` bytes, kept from
// then on (the trainer's persistent buckets).
int64_t StepEndPeak(const Sizes& z, const PipelineShape& shape, int rank, int64_t step, int64_t& held, int64_t peak,
                    int64_t largest, int64_t largest_clipped, int64_t state_bytes, int64_t replica_bucket) {
  int64_t clip = largest_clipped * (z.e == 8 ? 8 : 16);
  const int last = shape.stages() - 1;
  const bool owns_tied = z.model.tied && last > 0 && (shape.RankOfStage(0) == rank || shape.RankOfStage(last) == rank);
  if (owns_tied) {
    const int64_t tied = z.model.vocab * z.model.hidden * z.grad;
    clip = std::max(clip, shape.RankOfStage(0) == shape.RankOfStage(last) ? tied : 2 * tied + 2 * kMessageHeaderBytes);
  }
  const int64_t update = (z.adamw ? 2 * largest * z.e : 0) + (z.grad != z.e ? largest * z.e : 0);
  if (step == 0) held += replica_bucket;
  peak = std::max(peak, held + clip);
  if (step == 0) held += state_bytes;
  return std::max(peak, held + update);
}

}  // namespace

StepShapes StepShapesOf(const PipelineConfig& config, int64_t step) {
  const auto& data = config.train.data;
  const auto drawn = reference::MakeLengths(data, config.train.seed, step);
  const int64_t* lengths = drawn.data_ptr<int64_t>();
  const int64_t batch = data.batch;
  const int64_t longest = *std::max_element(lengths, lengths + batch);
  constexpr int64_t kIndex = sizeof(int64_t);
  StepShapes shapes;
  // The batch: tokens and labels (B, T), lengths (B). A microbatch's lengths are a view of the
  // batch's; its tokens and labels are too where narrowing keeps them contiguous (every position
  // kept, or a single sequence), and copies (b, t) otherwise.
  shapes.batch_bytes = 2 * batch * longest * kIndex + batch * kIndex;
  const auto sizes = reference::MicrobatchSizes(batch, static_cast<int64_t>(config.data_parallel) * config.microbatches);
  const size_t first = static_cast<size_t>(config.replica) * static_cast<size_t>(config.microbatches);
  int64_t start = 0;
  for (size_t part = 0; part < sizes.size(); ++part) {
    const int64_t size = sizes[part];
    const int64_t time = *std::max_element(lengths + start, lengths + start + size);
    const int64_t tokens = std::accumulate(lengths + start, lengths + start + size, int64_t{0});
    start += size;
    if (config.data_parallel > 1 && (part < first || part >= first + static_cast<size_t>(config.microbatches))) continue;
    shapes.microbatches.push_back({size, time, tokens});
    if (time != longest && size != 1) shapes.batch_bytes += 2 * size * time * kIndex;
  }
  return shapes;
}

ReferenceFloor ReferenceFloorOf(const PipelineConfig& config) {
  const Sizes z = SizesOf(config);
  const auto& model = z.model;
  const auto drawn = reference::MakeLengths(config.train.data, config.train.seed, 0);
  const double b = static_cast<double>(config.train.data.batch);
  const double t = static_cast<double>(drawn.max().item<int64_t>());
  const double n = b * t, h = static_cast<double>(model.hidden), e = static_cast<double>(z.e),
               s = static_cast<double>(z.s);
  const double mask = b * t * t;  // the attention's keep mask, a layer's own or the model's one
  const double scores = e * b * static_cast<double>(model.heads) * t * t + (z.mask_shared ? 0.0 : mask);
  const double layer = (8 * e + 2 * s) * n * h + (IsLlama(z) ? 4 : 2) * e * n * static_cast<double>(model.FfnSize()) +
                       scores + 2 * s * n;
  const double head = (2 * e + s) * n * h + static_cast<double>(z.loss) * n * static_cast<double>(model.vocab) + s * n;
  ReferenceFloor floor;
  floor.weights = static_cast<double>(model.ParameterCount()) * e;
  floor.activations = static_cast<double>(model.layers) * layer + head + (z.mask_shared ? mask : 0.0);
  floor.attention = static_cast<double>(model.layers) * scores;
  return floor;
}

MemoryPrediction PredictMemory(const PipelineConfig& config, const Schedule& schedule) {
  const Sizes z = SizesOf(config);
  const auto& shape = schedule.shape;
  const auto slices = StageSlices(PartitionLayers(z.model, shape.stages(), config.partition));
  MemoryPrediction prediction;
  prediction.peak_bytes.assign(shape.ranks, 0);
  prediction.held_after.resize(config.train.steps);
  prediction.peak_during.resize(config.train.steps);

  std::vector<int64_t> params(shape.ranks, 0), largest(shape.ranks, 0), largest_clipped(shape.ranks, 0);
  for (int s = 0; s < shape.stages(); ++s) {
    const int r = shape.RankOfStage(s);
    params[r] += StageParameterCount(z.model, slices[s]);
    largest[r] = std::max(largest[r], LargestParameter(z.model, slices[s]));
    largest_clipped[r] = std::max(largest_clipped[r], LargestParameter(z.model, slices[s], /*clipped=*/true));
  }
  for (int64_t step = 0; step < config.train.steps; ++step) {
    const StepShapes data = StepShapesOf(config, step);
    const auto& parts = data.microbatches;
    const int64_t batch_bytes = data.batch_bytes;
    prediction.held_after[step].resize(shape.ranks);
    prediction.peak_during[step].resize(shape.ranks);
    for (int rank = 0; rank < shape.ranks; ++rank) {
      const int64_t param_bytes = params[rank] * z.e;
      const int64_t state_bytes = z.adamw ? 2 * param_bytes : 0;
      const int64_t bucket = config.data_parallel > 1 ? params[rank] * z.grad : 0;
      const int64_t start = param_bytes + (step > 0 ? state_bytes + bucket : 0) + batch_bytes;
      RankWalk walk(z, slices, shape, parts, start, config.recompute);
      walk.Run(schedule.ranks[rank], prediction.held_after[step][rank], prediction.peak_during[step][rank]);
      int64_t held = walk.held();
      const int64_t peak = StepEndPeak(z, shape, rank, step, held, std::max(start, walk.peak()), largest[rank],
                                       largest_clipped[rank], state_bytes, bucket);
      prediction.peak_bytes[rank] = std::max(prediction.peak_bytes[rank], peak);
    }
  }
  prediction.params = std::move(params);
  return prediction;
}

}  // namespace pipecheck::pipeline
