// The reference's properties that parity rests on: per-name initialisation, padding
// invariance, independence of sequences, the data generator's rules, the loss's
// normalisation, clipping and the optimisers.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <optional>
#include <vector>

#include "reference/attention_core.h"
#include "reference/init.h"
#include "reference/linear.h"
#include "reference/loss.h"
#include "reference/optimizer.h"
#include "reference/rms_norm.h"
#include "reference/rotary.h"
#include "reference/score_softmax.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

using reference::Flavor;

// Loss and gradients of the whole model on `batch`, from a fresh trainer.
struct Outcome {
  double loss;
  reference::NamedTensors gradients;
};

Outcome LossAndGradients(const reference::TrainConfig& config, const reference::Batch& batch) {
  reference::ReferenceTrainer trainer(config);
  const double loss = trainer.ForwardBackward(batch).item<double>();
  return {loss, trainer.Gradients()};
}

torch::Tensor TokenLossesOf(const reference::TrainConfig& config, const reference::Batch& batch) {
  torch::NoGradGuard no_grad;
  auto model = reference::BuildSlice(config.model, reference::WholeModel(config.model), config.seed,
                                     torch::kFloat64, torch::kCPU);
  auto context = reference::MakeAttentionContext(config.model, batch.lengths, batch.time(), torch::kFloat64,
                                                 torch::kCPU);
  return reference::TokenLosses(model->forward(batch.tokens, context), batch.labels);  // (B, T)
}

class EachFlavor : public ::testing::TestWithParam<Flavor> {};

TEST_P(EachFlavor, InitialValuesDependOnlyOnSeedAndName) {
  auto config = testing::TinyConfig(GetParam(), /*tied=*/false);
  auto whole = reference::BuildSlice(config.model, reference::WholeModel(config.model), 5, torch::kFloat64,
                                     torch::kCPU);
  // docs/design.md §2's rule, checked from the values themselves: norm weights 1, biases 0, every other
  // weight drawn from normal(0, 0.02) (mean and spread within sampling error).
  for (const auto& item : whole->named_parameters()) {
    const auto& name = item.key();
    const auto values = item.value().to(torch::kFloat64).reshape(-1);
    const double n = static_cast<double>(values.numel());
    if (name.find("norm.weight") != std::string::npos) {
      EXPECT_TRUE(torch::equal(values, torch::ones_like(values))) << name;
    } else if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      EXPECT_TRUE(torch::equal(values, torch::zeros_like(values))) << name;
    } else {
      const double mean = values.mean().item<double>(), std = values.std().item<double>();
      EXPECT_LT(std::abs(mean), 5 * 0.02 / std::sqrt(n)) << name;
      EXPECT_NEAR(std, 0.02, 5 * 0.02 / std::sqrt(2 * n)) << name;
    }
  }
  // A middle slice and a deeper model build identical values under the same names.
  auto middle = reference::BuildSlice(config.model, {1, 2, false, false}, 5, torch::kFloat64, torch::kCPU);
  auto deeper_config = config.model;
  deeper_config.layers = 5;
  auto deeper = reference::BuildSlice(deeper_config, reference::WholeModel(deeper_config), 5, torch::kFloat64,
                                      torch::kCPU);
  const auto whole_parameters = whole->named_parameters();
  const auto deeper_parameters = deeper->named_parameters();
  for (const auto& item : middle->named_parameters()) {
    ASSERT_EQ(item.key().rfind("layers.1.", 0), 0u) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), whole_parameters[item.key()])) << item.key();
  }
  for (const auto& item : whole_parameters) {
    EXPECT_TRUE(torch::equal(item.value(), deeper_parameters[item.key()])) << item.key();
  }
  // Different seeds and different names give different draws.
  auto other_seed = reference::InitialValue(6, "layers.0.attention.wq.weight", {8, 8});
  EXPECT_FALSE(torch::equal(other_seed, whole_parameters["layers.0.attention.wq.weight"]));
  EXPECT_FALSE(torch::equal(whole_parameters["layers.0.attention.wk.weight"],
                            whole_parameters["layers.0.attention.wq.weight"]));
}

TEST_P(EachFlavor, ParameterNamesFollowTheDesign) {
  auto config = testing::TinyConfig(GetParam(), /*tied=*/false);
  auto model = reference::BuildSlice(config.model, reference::WholeModel(config.model), 1, torch::kFloat64,
                                     torch::kCPU);
  const auto parameters = model->named_parameters();
  const bool gpt2 = GetParam() == Flavor::kGpt2;
  EXPECT_TRUE(parameters.contains("tok_embeddings.weight"));
  EXPECT_EQ(parameters.contains("pos_embeddings.weight"), gpt2);
  EXPECT_TRUE(parameters.contains("layers.1.attention.wo.weight"));
  EXPECT_EQ(parameters.contains("layers.1.attention.wo.bias"), gpt2);
  EXPECT_EQ(parameters.contains("layers.0.feed_forward.w3.weight"), !gpt2);
  EXPECT_EQ(parameters.contains("layers.0.ffn_norm.bias"), gpt2);
  EXPECT_TRUE(parameters.contains("norm.weight"));
  EXPECT_TRUE(parameters.contains("output.weight"));
  const int64_t ffn = config.model.FfnSize();
  EXPECT_EQ(parameters["layers.0.feed_forward.w1.weight"].sizes(), torch::IntArrayRef({ffn, 8}));
  EXPECT_EQ(parameters["output.weight"].sizes(), torch::IntArrayRef({13, 8}));
}

TEST_P(EachFlavor, TiedModelHasOneSharedMatrix) {
  auto config = testing::TinyConfig(GetParam(), /*tied=*/true);
  auto model = reference::BuildSlice(config.model, reference::WholeModel(config.model), 1, torch::kFloat64,
                                     torch::kCPU);
  EXPECT_FALSE(model->named_parameters().contains("output.weight"));
  // The last stage of a pipeline owns a copy under the embedding's name, equal at start.
  auto head_only = reference::BuildSlice(config.model, {2, 2, false, true}, 1, torch::kFloat64, torch::kCPU);
  EXPECT_TRUE(torch::equal(head_only->named_parameters()["tok_embeddings.weight"],
                           model->named_parameters()["tok_embeddings.weight"]));
}

TEST_P(EachFlavor, ExtraPaddingChangesNothing) {
  auto config = testing::TinyConfig(GetParam(), /*tied=*/false);
  auto tokens = torch::randint(0, 13, {3, 9}, torch::kInt64);
  auto lengths = torch::tensor({5, 7, 3}, torch::kInt64);
  const auto tight = reference::MakeBatchFromSequences(tokens, lengths, 7);
  const auto padded = reference::MakeBatchFromSequences(tokens, lengths, 9, /*pad_token=*/11);
  ASSERT_EQ(tight.valid_tokens, padded.valid_tokens);
  const auto a = LossAndGradients(config, tight);
  const auto b = LossAndGradients(config, padded);
  EXPECT_LT(std::abs(a.loss - b.loss), 1e-12);
  for (const auto& item : a.gradients) {
    EXPECT_LT(testing::MaxAbsDiff(item.value(), b.gradients[item.key()]), 1e-12) << item.key();
  }
}

TEST_P(EachFlavor, SequenceLossesIgnoreTheirNeighbours) {
  auto config = testing::TinyConfig(GetParam(), /*tied=*/false);
  auto first = torch::randint(0, 13, {1, 9}, torch::kInt64);
  auto batch_a = reference::MakeBatchFromSequences(torch::cat({first, torch::randint(0, 13, {2, 9}, torch::kInt64)}),
                                                   torch::tensor({6, 4, 3}, torch::kInt64), 6);
  auto batch_b = reference::MakeBatchFromSequences(torch::cat({first, torch::randint(0, 13, {3, 9}, torch::kInt64)}),
                                                   torch::tensor({6, 9, 8, 2}, torch::kInt64), 9);
  auto losses_a = TokenLossesOf(config, batch_a);
  auto losses_b = TokenLossesOf(config, batch_b);
  EXPECT_GT(losses_a[0].abs().sum().item<double>(), 0.0);
  EXPECT_LT(testing::MaxAbsDiff(losses_a[0].narrow(0, 0, 6), losses_b[0].narrow(0, 0, 6)), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Flavors, EachFlavor, ::testing::Values(Flavor::kLlama, Flavor::kGpt2),
                         [](const auto& info) { return std::string(reference::FlavorName(info.param)); });

TEST(ModelConfig, FfnDefaultsFollowTheFlavour) {
  reference::ModelConfig config;
  config.hidden = 64;
  EXPECT_EQ(config.FfnSize(), 172);  // ceil(512 / 3) = 171 -> 172
  config.hidden = 96;
  EXPECT_EQ(config.FfnSize(), 256);
  config.flavor = Flavor::kGpt2;
  EXPECT_EQ(config.FfnSize(), 384);
  config.ffn = 100;
  EXPECT_EQ(config.FfnSize(), 100);
}

TEST(Data, BatchesAreDeterministicAndLabelledWithTheNextToken) {
  reference::DataConfig config{6, 12, 4, 50};
  const auto batch = reference::MakeBatch(config, 9, 3);
  EXPECT_TRUE(torch::equal(batch.tokens, reference::MakeBatch(config, 9, 3).tokens));
  EXPECT_FALSE(torch::equal(batch.lengths, reference::MakeBatch(config, 9, 4).lengths) &&
               torch::equal(batch.tokens, reference::MakeBatch(config, 9, 4).tokens));
  EXPECT_EQ(batch.time(), batch.lengths.max().item<int64_t>());
  int64_t valid = 0;
  for (int64_t b = 0; b < batch.size(); ++b) {
    const int64_t length = batch.lengths[b].item<int64_t>();
    EXPECT_GE(length, 4);
    EXPECT_LE(length, 12);
    for (int64_t t = 0; t < batch.time(); ++t) {
      const int64_t label = batch.labels[b][t].item<int64_t>();
      if (t + 1 < length) {
        EXPECT_EQ(label, batch.tokens[b][t + 1].item<int64_t>());
        ++valid;
      } else {
        EXPECT_EQ(label, reference::kIgnoreIndex) << "b=" << b << " t=" << t;
      }
    }
  }
  EXPECT_EQ(batch.valid_tokens, valid);
}

TEST(Data, MicrobatchesAreContiguousUnevenByAtMostOneAndTrimmed) {
  EXPECT_EQ(reference::MicrobatchSizes(7, 3), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(reference::MicrobatchSizes(4, 4), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_THROW(reference::MicrobatchSizes(3, 4), c10::Error);
  const auto batch = reference::MakeBatchFromSequences(torch::randint(0, 9, {5, 10}, torch::kInt64),
                                                       torch::tensor({3, 4, 10, 2, 5}, torch::kInt64), 10);
  const auto parts = reference::SplitMicrobatches(batch, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].size(), 3);
  EXPECT_EQ(parts[0].time(), 10);
  EXPECT_EQ(parts[1].time(), 5);
  EXPECT_TRUE(torch::equal(parts[1].tokens, batch.tokens.narrow(0, 3, 2).narrow(1, 0, 5)));
  EXPECT_EQ(parts[0].valid_tokens + parts[1].valid_tokens, batch.valid_tokens);
}

TEST(Loss, MicrobatchSumsOverBatchTokensEqualTheWholeBatchLoss) {
  auto config = testing::TinyConfig(Flavor::kLlama, false);
  config.data.batch = 5;
  const auto batch = reference::MakeBatch(config.data, 3, 0);
  auto model = reference::BuildSlice(config.model, reference::WholeModel(config.model), 3, torch::kFloat64,
                                     torch::kCPU);
  torch::NoGradGuard no_grad;
  auto loss_of = [&](const reference::Batch& part) {
    auto context = reference::MakeAttentionContext(config.model, part.lengths, part.time(), torch::kFloat64,
                                                   torch::kCPU);
    return reference::TokenLossSum(model->forward(part.tokens, context), part.labels).item<double>();
  };
  const double whole = loss_of(batch) / batch.valid_tokens;
  double summed = 0.0, mean_of_means = 0.0;
  const auto parts = reference::SplitMicrobatches(batch, 3);
  for (const auto& part : parts) {
    summed += loss_of(part) / batch.valid_tokens;
    mean_of_means += loss_of(part) / part.valid_tokens / parts.size();
  }
  EXPECT_LT(std::abs(whole - summed), 1e-12);
  EXPECT_GT(std::abs(whole - mean_of_means), 1e-6) << "uneven microbatches should tell the two apart";
}

TEST(Trainer, SgdStepIsWeightMinusLrTimesClippedGradient) {
  auto config = testing::TinyConfig(Flavor::kGpt2, true);
  config.optimizer = {reference::OptimizerKind::kSgd, 0.5};
  config.clip = 0.05;
  reference::ReferenceTrainer trainer(config);
  const auto before = trainer.Weights();
  const auto record = trainer.Step(0);
  ASSERT_GT(record.grad_norm, 0.05) << "the clip threshold should bite";
  double clipped_squares = 0.0;
  for (const auto& item : record.gradients) clipped_squares += item.value().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(clipped_squares), 0.05, 1e-6);
  const auto after = trainer.Weights();
  for (const auto& item : before) {
    auto expected = item.value() - 0.5 * record.gradients[item.key()];
    EXPECT_LT(testing::MaxAbsDiff(after[item.key()], expected), 1e-15) << item.key();
  }
}

// The global norm's squared sum is read off the device once, but added up as before: each
// parameter's float64 square sum, in parameter order, on the host. Bitwise, so the pipeline's
// per-rank sums still add up to the reference's.
TEST(Trainer, GradSquaredSumAddsParametersInOrderOnTheHost) {
  std::vector<torch::Tensor> parameters;
  for (int64_t i = 0; i < 6; ++i) {
    auto parameter = torch::randn({7, 5}, torch::dtype(torch::kFloat32).requires_grad(true));
    if (i != 3) parameter.mutable_grad() = torch::randn({7, 5}, torch::kFloat32) * std::pow(10.0, i - 3);
    parameters.push_back(parameter);  // the fourth has no gradient and counts for nothing
  }
  double expected = 0.0;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) expected += parameter.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  EXPECT_EQ(reference::GradSquaredSum(parameters), expected);
  EXPECT_EQ(reference::GradSquaredSum({}), 0.0);
}

TEST(Trainer, AdamWTrainsSeveralStepsWithFiniteLosses) {
  auto config = testing::TinyConfig(Flavor::kLlama, true);
  config.steps = 3;
  reference::ReferenceTrainer trainer(config);
  const auto result = trainer.Train();
  ASSERT_EQ(result.steps.size(), 3u);
  for (const auto& step : result.steps) EXPECT_TRUE(std::isfinite(step.loss));
  EXPECT_FALSE(torch::equal(result.final_weights["tok_embeddings.weight"],
                            reference::InitialValue(config.seed, "tok_embeddings.weight", {13, 8})));
}

// Phase times split a step without changing it: the same losses and weights, every phase of a
// step named once (a microbatched step's forwards summed), and a phase clock beside the
// host-sync check refused.
TEST(Trainer, PhaseTimesSplitAStepWithoutChangingIt) {
  auto config = testing::TinyConfig(Flavor::kLlama, true);
  config.steps = 3;
  config.microbatches = 2;
  const auto plain = reference::ReferenceTrainer(config).Train();
  config.phase_times = true;
  const auto split = reference::ReferenceTrainer(config).Train();
  for (size_t step = 0; step < 3; ++step) {
    EXPECT_EQ(split.steps[step].loss, plain.steps[step].loss);
    EXPECT_TRUE(plain.steps[step].phase_ms.empty());
    std::vector<std::string> names;
    double total = 0.0;
    for (const auto& [phase, ms] : split.steps[step].phase_ms) {
      names.push_back(phase);
      EXPECT_GE(ms, 0.0) << phase;
      if (phase != "copies") total += ms;  // the step's time leaves the gradient copies out
    }
    EXPECT_EQ(names, (std::vector<std::string>{"data", "forward", "loss", "backward", "accumulate", "grad_norm",
                                               "copies", "optimizer", "read_back"}));
    EXPECT_LE(total, split.steps[step].step_ms + 1e-6);  // the other phases lie inside the step
  }
  for (const auto& item : plain.final_weights) EXPECT_TRUE(torch::equal(item.value(), split.final_weights[item.key()]));
  const auto medians = split.MedianPhaseMs();
  ASSERT_EQ(medians.size(), 9u);
  EXPECT_EQ(medians[1].first, "forward");
  config.check_host_syncs = true;
  EXPECT_THROW(reference::ReferenceTrainer{config}, c10::Error);
}

TEST(Trainer, Bfloat16StepStaysCloseToFloat64OrSaysWhyNot) {
  auto config = testing::TinyConfig(Flavor::kLlama, false);
  try {
    reference::CheckDtypeSupported(torch::kBFloat16, torch::kCPU);
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("is not supported on cpu"), std::string::npos);
    GTEST_SKIP() << "this CPU build has no bfloat16 kernels: " << error.what_without_backtrace();
  }
  const auto batch = reference::MakeBatch(config.data, config.seed, 0);
  const double exact = LossAndGradients(config, batch).loss;
  config.dtype = torch::kBFloat16;
  const double low = LossAndGradients(config, batch).loss;
  EXPECT_NEAR(low, exact, 3e-2 * exact);
}

}  // namespace
}  // namespace pipecheck

namespace pipecheck {
namespace {

// |error| of a float32 dot product of length K: at most K · eps · Σ|terms| (loose by far in
// practice); 8 · eps · Σ|terms| leaves room for any blocking and rejects any wrong term. `want` and
// `scale` (Σ|terms| per element) in float64.
bool WithinFloat32Rounding(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& scale) {
  return ((got.to(torch::kFloat64) - want).abs() <= scale * (8 * 1.2e-7) + 1e-30).all().item<bool>();
}

// The linear layers' product (reference/linear.h), whichever kernel this process runs: the forward
// and the three gradients against float64's, within float32 rounding of a length-K dot product.
TEST(Linear, ProductAndGradientsAreFloat32RoundingOfFloat64s) {
  torch::manual_seed(7);
  for (const bool with_bias : {false, true}) {
    auto x = torch::randn({3, 40, 128}, torch::kFloat32).requires_grad_(true);
    auto weight = torch::randn({160, 128}, torch::kFloat32).requires_grad_(true);
    auto bias = with_bias ? torch::randn({160}, torch::kFloat32).requires_grad_(true) : torch::Tensor();
    auto upstream = torch::randn({3, 40, 160}, torch::kFloat32);
    auto y = reference::Linear(x, weight, bias);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 40, 160}));
    y.backward(upstream);
    auto x64 = x.detach().to(torch::kFloat64).requires_grad_(true);
    auto w64 = weight.detach().to(torch::kFloat64).requires_grad_(true);
    auto b64 = with_bias ? bias.detach().to(torch::kFloat64).requires_grad_(true) : torch::Tensor();
    auto y64 = torch::nn::functional::linear(x64, w64, b64);
    y64.backward(upstream.to(torch::kFloat64));
    auto y_scale = torch::nn::functional::linear(x64.detach().abs(), w64.detach().abs(),
                                                 with_bias ? b64.detach().abs() : torch::Tensor());
    EXPECT_TRUE(WithinFloat32Rounding(y, y64.detach(), y_scale)) << "bias " << with_bias;
    const auto g = upstream.to(torch::kFloat64).abs();
    EXPECT_TRUE(WithinFloat32Rounding(x.grad(), x64.grad(), g.matmul(w64.detach().abs()))) << "bias " << with_bias;
    EXPECT_TRUE(WithinFloat32Rounding(weight.grad(), w64.grad(),
                       g.reshape({-1, 160}).t().matmul(x64.detach().abs().reshape({-1, 128}))))
        << "bias " << with_bias;
    if (with_bias) {
      EXPECT_TRUE(WithinFloat32Rounding(bias.grad(), b64.grad(), g.reshape({-1, 160}).sum(0)));
    }
  }
}

// A microbatch's rows come out bitwise as the whole batch's (the kernel's blocking over rows does
// not reach into a row's sum), and float64 is ATen's product bit for bit.
TEST(Linear, RowsDoNotDependOnTheRestOfTheBatchAndFloat64IsAtens) {
  torch::manual_seed(11);
  const auto x = torch::randn({16, 128, 256}, torch::kFloat32);
  const auto weight = torch::randn({684, 256}, torch::kFloat32);
  torch::NoGradGuard no_grad;
  const auto whole = reference::Linear(x, weight);
  for (int64_t first = 0; first < 16; first += 2) {
    EXPECT_TRUE(torch::equal(reference::Linear(x.narrow(0, first, 2), weight), whole.narrow(0, first, 2)))
        << "microbatch at " << first;
  }
  const auto x64 = x.narrow(0, 0, 2).to(torch::kFloat64), w64 = weight.to(torch::kFloat64);
  EXPECT_TRUE(torch::equal(reference::Linear(x64, w64), torch::nn::functional::linear(x64, w64)));
  // A layer under 128 × 128 weights is ATen's product in float32 too (oneDNN's call costs more).
  const auto small = weight.narrow(0, 0, 32).narrow(1, 0, 32).contiguous();
  const auto x32 = x.narrow(-1, 0, 32).contiguous();
  EXPECT_TRUE(torch::equal(reference::Linear(x32, small), torch::nn::functional::linear(x32, small)));
  const std::string name = reference::CpuGemmName();
  EXPECT_TRUE(name == "onednn" || name == "aten") << name;
}

// Only the gradients asked for are made: an input-only backward (the split backward's I) makes no
// weight gradient (2 MiB here, against the input gradient's 8 KiB: the meter would see it), and a
// weight-only one (W) gets the right weight gradient without the input's.
TEST(Linear, MakesOnlyTheGradientsAskedFor) {
  reference::StartMemoryMeter();
  ASSERT_TRUE(reference::MemoryMeterActive());
  auto x = torch::randn({1, 4, 512}, torch::kFloat32).requires_grad_(true);
  auto weight = torch::randn({1024, 512}, torch::kFloat32).requires_grad_(true);
  auto bias = torch::randn({1024}, torch::kFloat32).requires_grad_(true);
  auto y = reference::Linear(x, weight, bias);
  const auto upstream = torch::randn_like(y);
  const int64_t before = reference::LiveTensorBytes();
  reference::ResetPeakTensorBytes();
  auto only_x = torch::autograd::grad({y}, {x}, {upstream}, /*retain_graph=*/true);
  EXPECT_LT(reference::PeakTensorBytes() - before, 1 << 20) << "an input-only backward made a weight gradient";
  auto only_w = torch::autograd::grad({y}, {weight}, {upstream});
  EXPECT_TRUE(torch::allclose(only_x[0], upstream.matmul(weight.detach()), 1e-4, 1e-4));
  EXPECT_TRUE(torch::allclose(only_w[0], upstream.reshape({-1, 1024}).t().mm(x.detach().reshape({-1, 512})), 1e-4,
                              1e-4));
}

// Gradient-accumulation fusion: under a FusedWeightGradients guard a second backward adds its
// weight gradient into the existing .grad in place, making no weight-sized temporary (1.4 MB here
// against the input gradient's 11 KB: the meter sees the difference), and the sum is the float64
// sum within float32 rounding, as without a guard, where the layer hands its gradient to
// AccumulateGrad; a .grad someone else holds gets the sum either way (AccumulateGrad, too, adds in
// place), and a weight with a tensor hook is left to AccumulateGrad, the hook seeing its gradient.
TEST(Linear, FusedWeightGradientsAddInPlaceWithoutATemporary) {
  if (!reference::LinearOnOneDnn(torch::kFloat32, torch::kCPU, 684, 512)) {
    GTEST_SKIP() << "this process runs ATen's product (PIPECHECK_CPU_GEMM=aten or no oneDNN): no fusion there";
  }
  reference::StartMemoryMeter();
  torch::manual_seed(17);
  const auto weight = torch::randn({512, 684}, torch::kFloat32).requires_grad_(true);
  const auto x1 = torch::randn({1, 4, 684}, torch::kFloat32), x2 = torch::randn({1, 4, 684}, torch::kFloat32);
  const auto g1 = torch::randn({1, 4, 512}, torch::kFloat32), g2 = torch::randn({1, 4, 512}, torch::kFloat32);
  const auto product = [](const torch::Tensor& g, const torch::Tensor& x) {
    return g.reshape({-1, 512}).t().to(torch::kFloat64).mm(x.reshape({-1, 684}).to(torch::kFloat64));
  };
  const auto want = product(g1, x1) + product(g2, x2);
  const auto scale = product(g1.abs(), x1.abs()) + product(g2.abs(), x2.abs());
  const auto weight_sized = static_cast<int64_t>(weight.numel() * sizeof(float));
  for (const bool fused : {false, true}) {
    weight.mutable_grad() = torch::Tensor();
    reference::Linear(x1, weight).backward(g1);  // the first backward makes .grad either way
    const void* first = weight.grad().data_ptr();
    auto y = reference::Linear(x2, weight);
    const int64_t before = reference::LiveTensorBytes();
    reference::ResetPeakTensorBytes();
    {
      std::optional<reference::FusedWeightGradients> guard;
      if (fused) guard.emplace();
      y.backward(g2);
    }
    const int64_t transient = reference::PeakTensorBytes() - before;
    if (fused) {
      EXPECT_LT(transient, weight_sized / 4) << "a fused backward made a weight-sized gradient";
    } else {
      EXPECT_GE(transient, weight_sized) << "the unfused backward made no weight gradient for AccumulateGrad";
    }
    EXPECT_EQ(weight.grad().data_ptr(), first) << "fused " << fused;
    EXPECT_TRUE(WithinFloat32Rounding(weight.grad(), want, scale)) << "fused " << fused;
  }
  // Someone holds the gradient: it is the weight's, and gets the sum in place, fused or not.
  weight.mutable_grad() = torch::Tensor();
  reference::Linear(x1, weight).backward(g1);
  const auto held = weight.grad();
  {
    const reference::FusedWeightGradients guard;
    reference::Linear(x2, weight).backward(g2);
  }
  EXPECT_TRUE(held.is_same(weight.grad()));
  EXPECT_TRUE(WithinFloat32Rounding(held, want, scale));
  // A hook on the weight sees the second backward's own gradient: that one is not fused.
  weight.mutable_grad() = torch::Tensor();
  reference::Linear(x1, weight).backward(g1);
  torch::Tensor seen;
  weight.register_hook([&seen](const torch::Tensor& gradient) { seen = gradient.clone(); });
  {
    const reference::FusedWeightGradients guard;
    reference::Linear(x2, weight).backward(g2);
  }
  ASSERT_TRUE(seen.defined()) << "the hook saw no gradient: the fused layer bypassed it";
  EXPECT_TRUE(WithinFloat32Rounding(seen, product(g2, x2), product(g2.abs(), x2.abs())));
  EXPECT_TRUE(WithinFloat32Rounding(weight.grad(), want, scale));
}

// The one-pass rotary embedding is the composite's result bit for bit, forward and backward, in
// float32 and float64, on the attention's layout (a (B, T, H·d) projection viewed as (B, H, T, d))
// and on a contiguous one, and runs its own kernel there (a fallback would pass unseen); reduced
// precision takes the composite.
TEST(Rotary, OnePassIsTheCompositeBitForBit) {
  torch::manual_seed(13);
  const int64_t batch = 3, heads = 4, time = 17, d = 32;
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto angles = torch::outer(torch::arange(time, torch::kFloat64), torch::rand({d / 2}, torch::kFloat64));
    const auto table = torch::cat({angles, angles}, -1);
    const auto cos = table.cos().to(dtype), sin = table.sin().to(dtype);
    for (const bool projected : {true, false}) {
      const auto source = projected ? torch::randn({batch, time, heads * d}, dtype)
                                    : torch::randn({batch, heads, time, d}, dtype);
      const auto upstream = torch::randn({batch, heads, time, d}, dtype);
      const auto view = [&](const torch::Tensor& t) {
        return projected ? t.view({batch, time, heads, d}).transpose(1, 2) : t;
      };
      auto leaf = source.clone().requires_grad_(true);
      auto twin = source.clone().requires_grad_(true);
      ASSERT_TRUE(reference::RotaryFused(view(leaf), cos, sin)) << dtype << " projected " << projected;
      const auto fused = reference::Rotary(view(leaf), cos, sin);
      const auto composite = reference::RotaryComposite(view(twin), cos, sin);
      EXPECT_EQ(fused.strides(), composite.strides()) << dtype << " projected " << projected;
      EXPECT_TRUE(torch::equal(fused, composite)) << dtype << " projected " << projected;
      fused.backward(upstream);
      composite.backward(upstream);
      EXPECT_TRUE(torch::equal(leaf.grad(), twin.grad())) << dtype << " projected " << projected;
      // Not a copy of its input: past position 0 (angle 0) the rotation moved every element.
      EXPECT_GT((fused - view(source)).narrow(2, 1, time - 1).abs().min().item<double>(), 0.0);
    }
  }
  const auto x = torch::randn({1, 2, 5, 8}, torch::kBFloat16);
  const auto table = torch::rand({5, 8}, torch::kBFloat16);
  EXPECT_FALSE(reference::RotaryFused(x, table, table));
  EXPECT_TRUE(torch::equal(reference::Rotary(x, table, table), reference::RotaryComposite(x, table, table)));
}

// Bit for bit: the same dtype and shape, and every element's bits (so +0 and −0 differ, and a NaN
// equals itself).
bool Bitwise(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto bits = a.element_size() == 8 ? torch::kInt64 : a.element_size() == 4 ? torch::kInt32 : torch::kInt16;
  return torch::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}

// The attention's (B, 1, T, T) keep mask for sequences of these lengths: causal, and no key past a
// sequence's length.
torch::Tensor CausalKeep(int64_t time, const std::vector<int64_t>& lengths) {
  const auto positions = torch::arange(time, torch::kInt64);
  const auto causal = positions.unsqueeze(1) >= positions.unsqueeze(0);
  const auto valid = positions.unsqueeze(0) < torch::tensor(lengths, torch::kInt64).unsqueeze(1);
  return (causal.unsqueeze(0) & valid.unsqueeze(1)).unsqueeze(1);
}

// The attention's masked, scaled softmax in one pass each way is the composite's result bit for
// bit, forward and backward, in float32 and float64, with a causal mask and padded sequences (the
// mask's rows differ by sequence), and runs its own kernel there (a fallback would pass unseen);
// bfloat16 takes the composite.
TEST(MaskedSoftmax, IsTheCompositeBitForBit) {
  torch::manual_seed(19);
  const int64_t batch = 3, heads = 4, time = 37;
  const auto keep = CausalKeep(time, {37, 20, 1});
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const int64_t head_dim : {32, 64, 24}) {  // √d irrational, exact, irrational
      const auto source = torch::randn({batch, heads, time, time}, dtype) * 4.0;
      const auto upstream = torch::randn({batch, heads, time, time}, dtype);
      auto leaf = source.clone().requires_grad_(true);
      auto twin = source.clone().requires_grad_(true);
      ASSERT_TRUE(reference::MaskedSoftmaxFused(leaf, keep)) << dtype << " d " << head_dim;
      const auto fused = reference::MaskedSoftmax(leaf, keep, head_dim);
      const auto composite = reference::MaskedSoftmaxComposite(twin, keep, head_dim);
      EXPECT_TRUE(Bitwise(fused, composite)) << dtype << " d " << head_dim;
      fused.backward(upstream);
      composite.backward(upstream);
      EXPECT_TRUE(Bitwise(leaf.grad(), twin.grad())) << dtype << " d " << head_dim;
      // Not trivially equal: masked weights are 0, the rest sum to 1 per row, gradients are +0
      // exactly where masked and not all zero elsewhere.
      EXPECT_EQ(fused.masked_select(keep.logical_not().expand_as(fused)).abs().max().item<double>(), 0.0);
      EXPECT_TRUE(torch::allclose(fused.sum(-1), torch::ones({batch, heads, time}, dtype)));
      EXPECT_GT(leaf.grad().masked_select(keep.expand_as(fused)).abs().max().item<double>(), 0.0);
    }
  }
  const auto raw = torch::randn({batch, heads, time, time}, torch::kBFloat16);
  EXPECT_FALSE(reference::MaskedSoftmaxFused(raw, keep));
  EXPECT_TRUE(Bitwise(reference::MaskedSoftmax(raw, keep, 32), reference::MaskedSoftmaxComposite(raw, keep, 32)));
  EXPECT_FALSE(reference::MaskedSoftmaxFused(torch::randn({batch, heads, time, time}).transpose(2, 3), keep));
}

// The attention between its projections as two nodes is the composite's result bit for bit,
// forward and backward (every projection's gradient, freeing as it goes or not), in float32 and
// float64, for llama (rotary), llama with grouped-query attention (two key/value heads for eight)
// and gpt2 (no rotary), with a causal mask and padded sequences, and runs as its two nodes there (a
// fallback would pass unseen); bfloat16 and a mask of another shape take the composite.
TEST(AttentionCore, TwoNodesAreTheCompositeBitForBit) {
  torch::manual_seed(23);
  const int64_t batch = 3, time = 19, d = 16;
  const auto keep = CausalKeep(time, {19, 11, 1});
  struct Case {
    const char* name;
    int64_t heads, kv_heads;
    bool rotary;
  };
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto angles = torch::outer(torch::arange(time, torch::kFloat64), torch::rand({d / 2}, torch::kFloat64));
    const auto table = torch::cat({angles, angles}, -1);
    const auto cos = table.cos().to(dtype), sin = table.sin().to(dtype);
    for (const Case& c : {Case{"llama", 4, 4, true}, Case{"llama gqa", 8, 2, true}, Case{"gpt2", 4, 4, false}}) {
      const auto what = ::testing::Message() << dtype << " " << c.name;
      const torch::Tensor c_cos = c.rotary ? cos : torch::Tensor(), c_sin = c.rotary ? sin : torch::Tensor();
      std::vector<torch::Tensor> sources{torch::randn({batch, time, c.heads * d}, dtype),
                                         torch::randn({batch, time, c.kv_heads * d}, dtype),
                                         torch::randn({batch, time, c.kv_heads * d}, dtype)};
      const auto upstream = torch::randn({batch, time, c.heads * d}, dtype);
      std::vector<torch::Tensor> fused_in, composite_in;
      for (const auto& source : sources) {
        fused_in.push_back(source.clone().requires_grad_(true));
        composite_in.push_back(source.clone().requires_grad_(true));
      }
      ASSERT_TRUE(reference::AttentionCoreFused(fused_in[0], fused_in[1], fused_in[2], keep, c_cos, c_sin, c.heads,
                                                c.kv_heads))
          << what;
      const auto fused = reference::AttentionCore(fused_in[0], fused_in[1], fused_in[2], keep, c_cos, c_sin, c.heads,
                                                  c.kv_heads);
      const auto composite = reference::AttentionCoreComposite(composite_in[0], composite_in[1], composite_in[2], keep,
                                                               c_cos, c_sin, c.heads, c.kv_heads);
      // Two nodes: the mix's leads to the scores' and to v; the scores' to q and k.
      const auto& scores = fused.grad_fn()->next_edge(0).function;
      EXPECT_EQ(fused.grad_fn()->next_edge(1).function, torch::autograd::impl::gradient_edge(fused_in[2]).function)
          << what;
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(scores->next_edge(i).function, torch::autograd::impl::gradient_edge(fused_in[i]).function)
            << what << " input " << i;
      }
      EXPECT_TRUE(fused.is_contiguous()) << what;
      EXPECT_TRUE(Bitwise(fused, composite)) << what;
      {
        const reference::SingleWalkBackward once;
        fused.backward(upstream);
      }
      composite.backward(upstream);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(Bitwise(fused_in[i].grad(), composite_in[i].grad())) << what << " input " << i;
        EXPECT_GT(fused_in[i].grad().abs().max().item<double>(), 0.0) << what << " input " << i;
      }
      // Without the guard a graph may be walked again (its saved tensors stay to the end); with
      // it, a second walk is refused rather than computed from nothing.
      std::vector<torch::Tensor> again;
      for (const auto& source : sources) again.push_back(source.clone().requires_grad_(true));
      const auto twice = reference::AttentionCore(again[0], again[1], again[2], keep, c_cos, c_sin, c.heads,
                                                  c.kv_heads);
      twice.backward(upstream, /*retain_graph=*/true);
      twice.backward(upstream);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(Bitwise(again[i].grad(), composite_in[i].grad() * 2)) << what << " input " << i;
      }
      const auto refused = reference::AttentionCore(again[0], again[1], again[2], keep, c_cos, c_sin, c.heads,
                                                    c.kv_heads);
      const reference::SingleWalkBackward once;
      refused.backward(upstream, /*retain_graph=*/true);
      EXPECT_THROW(refused.backward(upstream), c10::Error) << what;
    }
  }
  const auto q = torch::randn({batch, time, 4 * d}, torch::kBFloat16);
  EXPECT_FALSE(reference::AttentionCoreFused(q, q, q, keep, torch::Tensor(), torch::Tensor(), 4, 4));
  EXPECT_TRUE(Bitwise(reference::AttentionCore(q, q, q, keep, torch::Tensor(), torch::Tensor(), 4, 4),
                      reference::AttentionCoreComposite(q, q, q, keep, torch::Tensor(), torch::Tensor(), 4, 4)));
  const auto f = q.to(torch::kFloat32);
  EXPECT_FALSE(reference::AttentionCoreFused(f, f, f, keep.narrow(0, 0, 1), torch::Tensor(), torch::Tensor(), 4, 4));
}

// The one-pass RMSNorm normalisation runs where the layer's products run on oneDNN, agrees with the
// composite to float32's rounding forward and backward (the row sums are float64's, the
// composite's float32's), keeps each row independent of the rest of the batch bit for bit, and
// saves what the composite saves. Everywhere else it is the composite itself.
TEST(RmsNorm, OnePassMatchesTheCompositeRowByRow) {
  torch::manual_seed(17);
  const int64_t hidden = 256;
  const auto source = torch::randn({6, 33, hidden}, torch::kFloat32) * 3.0;
  const auto upstream = torch::randn({6, 33, hidden}, torch::kFloat32);
  const bool onednn = reference::CpuGemmName() == "onednn";
  EXPECT_EQ(reference::RmsNormFused(source), onednn);
  auto leaf = source.clone().requires_grad_(true);
  auto twin = source.clone().requires_grad_(true);
  const auto fused = reference::RmsNormalize(leaf, 1e-5);
  const auto composite = reference::RmsNormalizeComposite(twin, 1e-5);
  EXPECT_TRUE(torch::allclose(fused, composite, 2e-6, 1e-6)) << (fused - composite).abs().max().item<double>();
  fused.backward(upstream);
  composite.backward(upstream);
  EXPECT_TRUE(torch::allclose(leaf.grad(), twin.grad(), 2e-5, 1e-6))
      << (leaf.grad() - twin.grad()).abs().max().item<double>();
  // Against float64's exact arithmetic, the one pass is at least as close as the composite.
  auto exact_leaf = source.to(torch::kFloat64).requires_grad_(true);
  const auto exact = reference::RmsNormalizeComposite(exact_leaf, 1e-5);
  exact.backward(upstream.to(torch::kFloat64));
  const auto error = [&](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat64) - b).abs().max().item<double>();
  };
  EXPECT_LE(error(fused, exact), error(composite, exact) * 1.5 + 1e-12);
  EXPECT_LE(error(leaf.grad(), exact_leaf.grad()), error(twin.grad(), exact_leaf.grad()) * 1.5 + 1e-12);
  // A microbatch's rows are the whole batch's, forward and backward.
  for (int64_t first = 0; first < 6; first += 2) {
    auto part = source.narrow(0, first, 2).clone().requires_grad_(true);
    const auto y = reference::RmsNormalize(part, 1e-5);
    EXPECT_TRUE(torch::equal(y, fused.narrow(0, first, 2))) << "microbatch at " << first;
    y.backward(upstream.narrow(0, first, 2));
    EXPECT_TRUE(torch::equal(part.grad(), leaf.grad().narrow(0, first, 2))) << "microbatch at " << first;
  }
  // What the backward keeps: the input and one scale per row, as the composite.
  reference::StartMemoryMeter();
  ASSERT_TRUE(reference::MemoryMeterActive());
  const auto held = [&](bool one_pass) {
    auto x = source.clone().requires_grad_(true);
    const int64_t before = reference::LiveTensorBytes();
    auto y = one_pass ? reference::RmsNormalize(x, 1e-5) : reference::RmsNormalizeComposite(x, 1e-5);
    return reference::LiveTensorBytes() - before - y.numel() * 4;
  };
  EXPECT_EQ(held(true), held(false));
  // float64, a small layer and bfloat16's statistics copy's dtype aside, the composite.
  for (const auto& x : {source.to(torch::kFloat64), source.narrow(-1, 0, 64).contiguous(),
                        source.transpose(0, 1)}) {
    EXPECT_FALSE(reference::RmsNormFused(x));
    EXPECT_TRUE(torch::equal(reference::RmsNormalize(x, 1e-5), reference::RmsNormalizeComposite(x, 1e-5)));
  }
}

TEST(MemoryMeter, CountsAllocationsFreesAndPeaks) {
  reference::StartMemoryMeter();
  ASSERT_TRUE(reference::MemoryMeterActive());
  const int64_t before = reference::LiveTensorBytes();
  reference::ResetPeakTensorBytes();
  {
    auto big = torch::empty({1 << 20}, torch::kFloat64);  // 8 MiB
    EXPECT_EQ(reference::LiveTensorBytes() - before, 8 << 20);
  }
  EXPECT_EQ(reference::LiveTensorBytes(), before);
  EXPECT_GE(reference::PeakTensorBytes() - before, 8 << 20);
}

TEST(MemoryMeter, StepPeakLeavesOutGradientCopies) {
  reference::StartMemoryMeter();
  auto config = testing::TinyConfig(Flavor::kLlama, false);
  config.steps = 3;
  config.data.seq_len_min = config.data.seq_len;  // same shapes every step
  reference::ReferenceTrainer trainer(config);
  const auto result = trainer.Train();
  ASSERT_GT(result.steps[1].peak_bytes, 0);
  // Copies of every step's gradients pile up; the trainer's own peak must not grow with them.
  EXPECT_EQ(result.steps[2].peak_bytes, result.steps[1].peak_bytes);
  EXPECT_EQ(result.PeakBytes(), std::max({result.steps[0].peak_bytes, result.steps[1].peak_bytes,
                                           result.steps[2].peak_bytes}));
}

}  // namespace
}  // namespace pipecheck

namespace pipecheck {
namespace {

reference::ModelConfig MoeModel(double expert_bias) {
  reference::ModelConfig config;
  config.flavor = reference::Flavor::kLlama;
  config.layers = 1;
  config.hidden = 16;
  config.heads = 2;
  config.experts = 6;
  config.top_k = 2;
  config.aux_loss = 0.0;
  config.expert_bias = expert_bias;
  return config;
}

// One MoE feed-forward over `x` (B, T, hidden) with every position valid; what it recorded.
std::shared_ptr<reference::MoeRecord> RunMoe(reference::MoeFeedForward& layer, const torch::Tensor& x,
                                             reference::AttentionContext context) {
  context.valid = torch::ones({x.size(0), x.size(1)}, torch::kBool);
  context.lengths = torch::full({x.size(0)}, static_cast<double>(x.size(1)), torch::kFloat64);
  context.router_dtype = torch::kFloat64;
  context.moe = std::make_shared<reference::MoeRecord>();
  layer->forward(x, context);
  return context.moe;
}

TEST(ExpertBias, MovesBySignOfMeanMinusCountInItsDtype) {
  const auto bias = torch::tensor({0.5, 0.0, -0.25, 0.0}, torch::kFloat32);
  const auto counts = torch::tensor({10, 2, 6, 6}, torch::kInt64);  // mean 6
  const auto moved = reference::MovedExpertBias(bias, counts, 1e-3);
  EXPECT_EQ(moved.scalar_type(), torch::kFloat32);
  const auto gamma = torch::tensor(1e-3, torch::kFloat32);
  EXPECT_TRUE(torch::equal(moved, bias + gamma * torch::tensor({-1.0, 1.0, 0.0, 0.0}, torch::kFloat32)));
  EXPECT_EQ(reference::LayerOfName("layers.12.feed_forward.expert_bias"), 12);
  EXPECT_EQ(reference::LayerOfName("norm.weight"), -1);
}

TEST(ExpertBias, WeighsInTheChoiceOnlyAndLivesInTheRoutersDtype) {
  auto slice = reference::BuildSlice(MoeModel(1e-3), reference::WholeModel(MoeModel(1e-3)), 7, torch::kBFloat16,
                                     torch::kCPU);
  const auto biases = reference::ExpertBiases(*slice);
  ASSERT_EQ(biases.size(), 1u);
  EXPECT_EQ(biases.begin()->key(), "layers.0.feed_forward.expert_bias");
  EXPECT_EQ(biases.begin()->value().scalar_type(), torch::kFloat32);  // not the model's bfloat16
  EXPECT_TRUE(torch::equal(biases.begin()->value(), torch::zeros({6})));

  torch::manual_seed(3);
  reference::MoeFeedForward layer(MoeModel(1e-3), 0);
  layer->to(torch::kFloat64);
  for (auto& buffer : layer->buffers()) buffer.set_data(torch::zeros({6}, torch::kFloat64));
  const auto x = torch::randn({2, 5, 16}, torch::kFloat64);
  const auto unbiased = RunMoe(layer, x, {});
  // A bias far above every score on expert 5 puts it in every token's top 2.
  layer->named_buffers()["expert_bias"].fill_(0.0);
  layer->named_buffers()["expert_bias"][5] = 10.0;
  const auto biased = RunMoe(layer, x, {});
  EXPECT_EQ(biased->counts.at(0)[5].item<int64_t>(), 10);
  EXPECT_FALSE(torch::equal(biased->counts.at(0), unbiased->counts.at(0)));
  EXPECT_EQ(biased->counts.at(0).sum().item<int64_t>(), 20);  // 10 tokens, 2 choices each
}

// Routing within rounding: a token whose own k-th/(k+1)-th margin lies within the tolerance takes
// another run's choice; one beyond it keeps its own and is reported.
TEST(RoutingSuggestion, TakenWithinTheToleranceAndReportedBeyondIt) {
  torch::manual_seed(5);
  reference::MoeFeedForward layer(MoeModel(0.0), 0);
  layer->to(torch::kFloat64);
  const auto x = torch::randn({1, 8, 16}, torch::kFloat64);
  const auto own = RunMoe(layer, x, {})->chosen.at(0);  // (8, 2)
  // The other run swapped token 3's second choice for another expert.
  auto other = own.clone();
  int64_t swapped = 0;
  while (swapped == own[3][0].item<int64_t>() || swapped == own[3][1].item<int64_t>()) ++swapped;
  other[3][1] = swapped;
  reference::AttentionContext context;
  context.suggested_routing[0] = other;

  context.routing_tolerance = 1e6;  // everything is within: the suggestion is taken
  const auto taken = RunMoe(layer, x, context);
  EXPECT_EQ(taken->adopted, 1);
  EXPECT_EQ(taken->beyond, 0);
  EXPECT_TRUE(torch::equal(taken->chosen.at(0), other));

  context.routing_tolerance = 0.0;  // nothing is within: its own choice stays, reported
  const auto kept = RunMoe(layer, x, context);
  EXPECT_EQ(kept->adopted, 0);
  EXPECT_EQ(kept->beyond, 1);
  EXPECT_TRUE(torch::equal(kept->chosen.at(0), own));
  EXPECT_NE(kept->first_beyond.find("layer 0, sequence 0, position 3"), std::string::npos) << kept->first_beyond;

  // A suggestion equal to its own choice is no disagreement, whatever the tolerance.
  context.suggested_routing[0] = own;
  EXPECT_EQ(RunMoe(layer, x, context)->beyond, 0);
}

}  // namespace
}  // namespace pipecheck
