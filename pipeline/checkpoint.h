// The checkpoint pipecheck's trainer writes when a scenario stops at a resume, and reads at any
// other layout: every tensor under its parameter's global name, so that no file depends on which
// rank held what.
//
// A checkpoint is a folder:
//  - stage{S}.pt, one per stage of the layout that wrote it, by the rank that held stage S in
//    replica 0: for each of the stage's parameters NAME, `weight/NAME`, AdamW's `exp_avg/NAME` and
//    `exp_avg_sq/NAME` and its step count `step/NAME` (0-dim int64; no optimizer entries for SGD
//    or before the first step), and each expert bias as `expert_bias/NAME`. A tied weight held by
//    two stages is in both files, and must be equal in both;
//  - data.replica{R}.pt, one per replica, by the rank of its first stage: the replica's data
//    position, `next_step` (the batch its next step trains on), `replica` and `replicas` (whose
//    share of that batch it trains on, out of how many);
//  - manifest.json, written last by global rank 0 once every other file is written: the step,
//    the layout, and each file's name, size, FNV-1a hash and keys. A checkpoint without it is one
//    whose writers did not all finish.
// Every file is written atomically (a temporary name, then a rename), so a rank killed while
// writing leaves no file under the final name; loading verifies each listed file's size and hash
// and refuses, naming the file, whatever does not match.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/model.h"

namespace pipecheck::pipeline {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr const char* kCheckpointManifest = "manifest.json";

std::string StageFileName(int stage);      // "stage3.pt"
std::string DataFileName(int replica);     // "data.replica1.pt"

// The key a parameter's part is saved under: "weight/NAME", "exp_avg/NAME", ...; and the
// parameter name and the part back from a key ("exp_avg/layers.0.x" -> {"exp_avg", "layers.0.x"}).
std::string CheckpointKey(const std::string& part, const std::string& name);
std::pair<std::string, std::string> SplitCheckpointKey(const std::string& key);

// A dict of tensors as a file LibTorch's pickle_load (and Python's torch.load) reads, written
// atomically; and read back, a CheckpointError naming the file when it cannot be.
void WriteTensorFile(const std::string& path, const reference::NamedTensors& tensors);
reference::NamedTensors ReadTensorFile(const std::string& path);

struct CheckpointFile {
  std::string name;
  int64_t bytes = 0;
  std::string hash;  // FNV-1a 64 of the contents, 16 hex digits
  std::vector<std::string> keys;
};

struct CheckpointManifest {
  int64_t step = 0;      // the steps taken: the next one is `step`
  int stages = 0;        // of the layout that wrote it
  int replicas = 1;
  std::string layout;    // that layout in words, for messages
  std::vector<CheckpointFile> files;
};

// Writes the manifest of `files` (each read back for its size, hash and keys) into `folder`,
// atomically. A listed file that is not there is a CheckpointError.
void WriteManifest(const std::string& folder, CheckpointManifest manifest, const std::vector<std::string>& files);

// The manifest of `folder`; a CheckpointError when there is none (an unfinished checkpoint) or it
// does not parse.
CheckpointManifest ReadManifest(const std::string& folder);

// Every file the manifest's layout writes (each stage's, each replica's) is listed; a
// CheckpointError naming the first that is not otherwise.
void CheckComplete(const std::string& folder, const CheckpointManifest& manifest);

// Checks one listed file against the manifest (present, its size, its hash); a CheckpointError
// naming the file otherwise.
void VerifyFile(const std::string& folder, const CheckpointFile& file);

// Everything a checkpoint holds, every file verified first: its tensors by key (a key two files
// hold, the tied weight, must be bitwise equal in both) and each replica's data position.
struct CheckpointContents {
  CheckpointManifest manifest;
  reference::NamedTensors tensors;
  std::vector<reference::NamedTensors> data;  // by replica
};
CheckpointContents ReadCheckpoint(const std::string& folder);

}  // namespace pipecheck::pipeline
