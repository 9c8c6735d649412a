// The reference's backward pass against central finite differences in float64, for both
// flavours, tied and untied, on a batch with variable lengths and padding.
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "reference/loss.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

using reference::Flavor;

struct GradientCase {
  Flavor flavor;
  bool tied;
};

std::string CaseName(const ::testing::TestParamInfo<GradientCase>& info) {
  return std::string(reference::FlavorName(info.param.flavor)) + (info.param.tied ? "_tied" : "_untied");
}

class ReferenceGradient : public ::testing::TestWithParam<GradientCase> {};

TEST_P(ReferenceGradient, MatchesCentralFiniteDifferences) {
  const auto config = testing::TinyConfig(GetParam().flavor, GetParam().tied);
  reference::ReferenceTrainer trainer(config);
  const auto batch = reference::MakeBatch(config.data, config.seed, /*step=*/0);
  ASSERT_LT(batch.lengths.min().item<int64_t>(), batch.time()) << "the batch should contain padding";
  trainer.ForwardBackward(batch);

  auto loss_now = [&] {
    torch::NoGradGuard no_grad;
    auto context = reference::MakeAttentionContext(config.model, batch.lengths, batch.time(), torch::kFloat64,
                                                   torch::kCPU);
    auto logits = trainer.model()->forward(batch.tokens, context);
    return (reference::TokenLossSum(logits, batch.labels) / static_cast<double>(batch.valid_tokens)).item<double>();
  };

  constexpr double kStep = 1e-5;
  constexpr int64_t kSamplesPerParameter = 24;
  int64_t checked = 0;
  for (auto& item : trainer.model()->named_parameters()) {
    auto parameter = item.value();
    auto gradient = parameter.grad().reshape(-1);
    // A key projection's bias adds the same value to every score of a query's row, which softmax
    // ignores: its gradient is zero analytically and holds rounding noise only. Every other
    // parameter's gradient is really non-zero.
    const bool analytically_zero = item.key().find("attention.wk.bias") != std::string::npos;
    if (analytically_zero) {
      EXPECT_LT(gradient.abs().max().item<double>(), 1e-12) << item.key() << " should be zero up to rounding";
    } else {
      ASSERT_GT(gradient.abs().max().item<double>(), 1e-8) << item.key() << " has a (near) all-zero gradient";
    }
    auto flat = parameter.data().view(-1);
    const int64_t numel = flat.numel();
    const int64_t stride = std::max<int64_t>(1, numel / kSamplesPerParameter);
    for (int64_t index = 0; index < numel; index += stride) {
      const double original = flat[index].item<double>();
      flat[index] = original + kStep;
      const double plus = loss_now();
      flat[index] = original - kStep;
      const double minus = loss_now();
      flat[index] = original;
      const double numeric = (plus - minus) / (2 * kStep);
      const double analytic = gradient[index].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-8 + 1e-6 * std::abs(analytic)) << item.key() << "[" << index << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

INSTANTIATE_TEST_SUITE_P(AllFlavors, ReferenceGradient,
                         ::testing::Values(GradientCase{Flavor::kLlama, false}, GradientCase{Flavor::kLlama, true},
                                           GradientCase{Flavor::kGpt2, false}, GradientCase{Flavor::kGpt2, true}),
                         CaseName);

}  // namespace
}  // namespace pipecheck
