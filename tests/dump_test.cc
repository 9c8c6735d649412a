// `pipecheck dump` round trip: what the files hold, read back with LibTorch's pickle_load,
// is exactly the reference's first step.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <fstream>
#include <sstream>

#include "harness/dump.h"
#include "harness/scenario_model.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

c10::Dict<c10::IValue, c10::IValue> LoadDict(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

class DumpRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(DumpRoundTrip, FilesHoldTheReferencesFirstStep) {
  const auto suite = harness::ParseSuite(
      "name,flavor,layers,hidden,heads,tied,batch,seq_len,seq_len_min,vocab\n"
      "llama_untied,llama,2,16,2,0,5,12,4,31\n"
      "gpt2_tied,gpt2,2,16,2,1,5,12,4,31\n",
      "dump.csv");
  const scenarios::Scenario scenario = scenarios::FindScenario(suite, GetParam(), "dump.csv");
  const std::string directory = testing::ScratchDirectory("dump_" + GetParam());
  harness::DumpReference(scenario, directory);

  auto config = harness::ToTrainConfig(scenario);
  reference::ReferenceTrainer trainer(config);
  const auto weights = trainer.Weights();
  const auto batch = reference::MakeBatch(config.data, config.seed, 0);
  const double loss = trainer.ForwardBackward(batch).item<double>();
  const auto gradients = trainer.Gradients();

  const auto dumped_weights = LoadDict(directory + "/weights.pt");
  const auto dumped_gradients = LoadDict(directory + "/grads.pt");
  EXPECT_EQ(dumped_weights.size(), weights.size());
  EXPECT_EQ(dumped_gradients.size(), gradients.size());
  EXPECT_EQ(dumped_weights.contains("output.weight"), !scenario.tied);
  for (const auto& item : weights) {
    ASSERT_TRUE(dumped_weights.contains(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(dumped_weights.at(item.key()).toTensor(), item.value())) << item.key();
    EXPECT_TRUE(torch::equal(dumped_gradients.at(item.key()).toTensor(), gradients[item.key()])) << item.key();
  }
  const auto dumped_batch = LoadDict(directory + "/batch.pt");
  EXPECT_TRUE(torch::equal(dumped_batch.at("tokens").toTensor(), batch.tokens));
  EXPECT_TRUE(torch::equal(dumped_batch.at("labels").toTensor(), batch.labels));
  EXPECT_TRUE(torch::equal(dumped_batch.at("lengths").toTensor(), batch.lengths));
  const auto dumped_loss = LoadDict(directory + "/loss.pt").at("loss").toTensor();
  EXPECT_EQ(dumped_loss.dim(), 0);
  EXPECT_EQ(dumped_loss.item<double>(), loss);

  // scenario.csv loads back as the same scenario, with ffn made explicit.
  const auto reloaded = harness::LoadSuite(directory + "/scenario.csv");
  ASSERT_EQ(reloaded.size(), 1u);
  EXPECT_EQ(reloaded[0].ffn, harness::ToModelConfig(scenario).FfnSize());
  EXPECT_EQ(scenarios::ColumnValues(reloaded[0]), scenarios::ColumnValues(harness::WithEffectiveValues(scenario)));
}

INSTANTIATE_TEST_SUITE_P(Scenarios, DumpRoundTrip, ::testing::Values("llama_untied", "gpt2_tied"));

}  // namespace
}  // namespace pipecheck
