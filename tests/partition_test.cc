// Partitioning layers over stages: uniform with empty stages, parameter balancing, explicit
// counts and their errors, and the parameter counts balancing relies on.
#include <gtest/gtest.h>

#include "pipeline/partition.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

using reference::Flavor;

reference::ModelConfig Model(Flavor flavor, int64_t layers, bool tied) {
  reference::ModelConfig config;
  config.flavor = flavor;
  config.layers = layers;
  config.tied = tied;
  return config;
}

TEST(Partition, UniformSpreadsTheRemainderOverTheFirstStages) {
  EXPECT_EQ(pipeline::PartitionLayers(Model(Flavor::kLlama, 7, false), 3, "uniform"), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(pipeline::PartitionLayers(Model(Flavor::kLlama, 2, false), 4, "uniform"),
            (std::vector<int64_t>{1, 1, 0, 0}));
}

TEST(Partition, ExplicitCountsAreCheckedAgainstStagesAndLayers) {
  const auto model = Model(Flavor::kLlama, 3, false);
  EXPECT_EQ(pipeline::PartitionLayers(model, 4, "0;2;0;1"), (std::vector<int64_t>{0, 2, 0, 1}));
  EXPECT_THROW(pipeline::PartitionLayers(model, 3, "0;2;0;1"), c10::Error);
  EXPECT_THROW(pipeline::PartitionLayers(model, 2, "1;1"), c10::Error);
  EXPECT_THROW(pipeline::PartitionLayers(model, 2, "1;x"), c10::Error);
}

TEST(Partition, ParamsBalancesEmbeddingAndHeadAgainstLayers) {
  // A large vocabulary makes the embedding and head worth several layers each.
  auto model = Model(Flavor::kLlama, 8, false);
  model.vocab = 2048;  // embedding 131072 parameters, head 131136, a layer 49536
  const auto counts = pipeline::PartitionLayers(model, 4, "params");
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 3, 3, 1}));
  int64_t largest = 0;
  for (const auto& slice : pipeline::StageSlices(counts)) {
    largest = std::max(largest, pipeline::StageParameterCount(model, slice));
  }
  EXPECT_LE(largest, pipeline::StageParameterCount(model, {0, 2, true, false}));
}

TEST(Partition, StageSlicesPlaceEmbeddingAndHeadAtTheEnds) {
  const auto slices = pipeline::StageSlices({0, 2, 0, 1});
  ASSERT_EQ(slices.size(), 4u);
  EXPECT_TRUE(slices[0].has_embedding && !slices[0].has_head && slices[0].first_layer == slices[0].end_layer);
  EXPECT_EQ(slices[1].first_layer, 0);
  EXPECT_EQ(slices[1].end_layer, 2);
  EXPECT_EQ(slices[2].first_layer, 2);
  EXPECT_EQ(slices[2].end_layer, 2);
  EXPECT_TRUE(slices[3].has_head && !slices[3].has_embedding && slices[3].end_layer == 3);
  const auto solo = pipeline::StageSlices({3});
  EXPECT_TRUE(solo[0].has_embedding && solo[0].has_head);
}

TEST(Partition, ParameterCountsMatchBuiltModules) {
  for (auto flavor : {Flavor::kLlama, Flavor::kGpt2}) {
    for (bool tied : {false, true}) {
      auto config = testing::TinyConfig(flavor, tied).model;
      for (const auto& slice : std::vector<reference::SliceSpec>{{0, 2, true, true}, {0, 1, true, false},
                                                                 {1, 2, false, true}, {1, 1, false, false}}) {
        auto module = reference::BuildSlice(config, slice, 1, torch::kFloat64, torch::kCPU);
        int64_t numel = 0;
        for (const auto& p : module->parameters()) numel += p.numel();
        EXPECT_EQ(pipeline::StageParameterCount(config, slice), numel)
            << reference::FlavorName(flavor) << " tied=" << tied << " slice [" << slice.first_layer << ","
            << slice.end_layer << ")";
      }
    }
  }
}

}  // namespace
}  // namespace pipecheck
