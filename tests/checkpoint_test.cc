// Checkpoints by global name (pipeline/checkpoint.h): what a complete one reads back as, and every
// way an incomplete or damaged one is refused, naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pipeline/checkpoint.h"
#include "reference/optimizer.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

namespace fs = std::filesystem;
using pipeline::CheckpointError;

std::string Folder(const std::string& name) { return testing::ScratchDirectory("checkpoint_" + name); }

reference::NamedTensors Stage(double scale, bool tied) {
  reference::NamedTensors state;
  if (tied) state.insert("weight/tok_embeddings.weight", torch::arange(6, torch::kFloat64).reshape({2, 3}));
  state.insert("weight/layers.0.w", torch::full({2}, scale, torch::kFloat64));
  state.insert("exp_avg/layers.0.w", torch::full({2}, 0.5 * scale, torch::kFloat64));
  state.insert("step/layers.0.w", torch::scalar_tensor(int64_t{3}, torch::kInt64));
  return state;
}

// Two stages sharing a tied weight, one replica, committed.
std::string Complete(const std::string& name) {
  const std::string folder = Folder(name);
  pipeline::WriteTensorFile(folder + "/stage0.pt", Stage(1.0, true));
  auto last = Stage(1.0, true);
  reference::NamedTensors renamed;
  for (const auto& item : last) renamed.insert(item.key() == "weight/layers.0.w" ? "weight/layers.1.w" : item.key(), item.value());
  pipeline::WriteTensorFile(folder + "/stage1.pt", renamed);
  reference::NamedTensors data;
  data.insert("next_step", torch::scalar_tensor(int64_t{2}, torch::kInt64));
  pipeline::WriteTensorFile(folder + "/data.replica0.pt", data);
  pipeline::CheckpointManifest manifest;
  manifest.step = 2;
  manifest.stages = 2;
  manifest.replicas = 1;
  pipeline::WriteManifest(folder, manifest, {"stage0.pt", "stage1.pt", "data.replica0.pt"});
  return folder;
}

std::string ErrorReading(const std::string& folder) {
  try {
    pipeline::ReadCheckpoint(folder);
  } catch (const CheckpointError& error) {
    return error.what();
  }
  return "";
}

TEST(Checkpoint, ReadsEveryTensorByNameAndEachReplicasDataPosition) {
  const auto folder = Complete("complete");
  const auto contents = pipeline::ReadCheckpoint(folder);
  EXPECT_EQ(contents.manifest.step, 2);
  EXPECT_TRUE(contents.tensors.contains("weight/layers.0.w"));
  EXPECT_TRUE(contents.tensors.contains("weight/layers.1.w"));
  EXPECT_TRUE(torch::equal(contents.tensors["weight/tok_embeddings.weight"],
                           torch::arange(6, torch::kFloat64).reshape({2, 3})));
  ASSERT_EQ(contents.data.size(), 1u);
  EXPECT_EQ(contents.data[0]["next_step"].item<int64_t>(), 2);
  EXPECT_EQ(pipeline::SplitCheckpointKey("exp_avg/layers.0.w"), std::make_pair(std::string("exp_avg"), std::string("layers.0.w")));
}

TEST(Checkpoint, AnUnfinishedOneHasNoManifestAndIsRefused) {
  const auto folder = Folder("unfinished");
  pipeline::WriteTensorFile(folder + "/stage0.pt", Stage(1.0, false));
  const std::string error = ErrorReading(folder);
  EXPECT_NE(error.find(folder + "/manifest.json: missing, so the checkpoint is incomplete"), std::string::npos) << error;
  EXPECT_NE(error.find("the folder holds: stage0.pt"), std::string::npos) << error;
  // The manifest cannot be written over a missing file either.
  pipeline::CheckpointManifest manifest;
  manifest.stages = 2;
  EXPECT_THROW(pipeline::WriteManifest(folder, manifest, {"stage0.pt", "stage1.pt"}), CheckpointError);
}

TEST(Checkpoint, ATruncatedOrRewrittenFileIsRefusedByName) {
  auto folder = Complete("truncated");
  fs::resize_file(folder + "/stage1.pt", fs::file_size(folder + "/stage1.pt") / 2);
  std::string error = ErrorReading(folder);
  EXPECT_NE(error.find(folder + "/stage1.pt: "), std::string::npos) << error;
  EXPECT_NE(error.find("where the manifest lists"), std::string::npos) << error;

  folder = Complete("rewritten");
  auto other = Stage(2.0, true);
  pipeline::WriteTensorFile(folder + "/stage0.pt", other);  // same size, other bytes
  error = ErrorReading(folder);
  EXPECT_NE(error.find(folder + "/stage0.pt: contents hash"), std::string::npos) << error;

  folder = Complete("removed");
  fs::remove(folder + "/data.replica0.pt");
  EXPECT_NE(ErrorReading(folder).find(folder + "/data.replica0.pt: listed in the manifest but missing"), std::string::npos);
}

TEST(Checkpoint, AManifestMissingAFileItsLayoutWritesIsIncomplete) {
  const std::string folder = Folder("unlisted");
  pipeline::WriteTensorFile(folder + "/stage0.pt", Stage(1.0, false));
  reference::NamedTensors data;
  data.insert("next_step", torch::scalar_tensor(int64_t{2}, torch::kInt64));
  pipeline::WriteTensorFile(folder + "/data.replica0.pt", data);
  pipeline::CheckpointManifest manifest;
  manifest.stages = 2;
  pipeline::WriteManifest(folder, manifest, {"stage0.pt", "data.replica0.pt"});
  const std::string error = ErrorReading(folder);
  EXPECT_NE(error.find("writes stage1.pt, which the manifest does not list"), std::string::npos) << error;
}

TEST(Checkpoint, TiedCopiesMustAgree) {
  const auto folder = Complete("tied");
  auto last = pipeline::ReadTensorFile(folder + "/stage1.pt");
  last["weight/tok_embeddings.weight"] = last["weight/tok_embeddings.weight"] + 1.0;
  pipeline::WriteTensorFile(folder + "/stage1.pt", last);
  pipeline::CheckpointManifest manifest;
  manifest.step = 2;
  manifest.stages = 2;
  pipeline::WriteManifest(folder, manifest, {"stage0.pt", "stage1.pt", "data.replica0.pt"});
  const std::string error = ErrorReading(folder);
  EXPECT_NE(error.find("stage1.pt: weight/tok_embeddings.weight differs from the copy in stage0.pt"), std::string::npos)
      << error;
}

// AdamW's state by parameter, out of one optimizer and into another, bit for bit.
TEST(Checkpoint, OptimizerStateMovesBetweenOptimizers) {
  auto weight = torch::ones({3}, torch::kFloat64).requires_grad_();
  auto optimizer = reference::MakeOptimizer({}, {weight});
  weight.mutable_grad() = torch::full({3}, 0.25, torch::kFloat64);
  optimizer->step();
  const auto state = reference::StateOf(*optimizer, weight);
  ASSERT_TRUE(state.present);
  EXPECT_EQ(state.step, 1);
  auto copy = weight.detach().clone().requires_grad_();
  auto other = reference::MakeOptimizer({}, {copy});
  EXPECT_FALSE(reference::StateOf(*other, copy).present);
  reference::SetState(*other, copy, state);
  weight.mutable_grad() = torch::full({3}, -0.5, torch::kFloat64);
  copy.mutable_grad() = torch::full({3}, -0.5, torch::kFloat64);
  optimizer->step();
  other->step();
  EXPECT_TRUE(torch::equal(weight, copy));
  EXPECT_EQ(reference::StateOf(*other, copy).step, 2);
}

}  // namespace
}  // namespace pipecheck
