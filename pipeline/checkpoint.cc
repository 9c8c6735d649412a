// Checkpoints by global name (see checkpoint.h).
#include "pipeline/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "reports/csv.h"

namespace pipecheck::pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kManifestFormat = 1;

std::string ReadBytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  return std::string((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
}

// reports::WriteFileAtomically (a temporary name, then a rename), its failure a CheckpointError.
void WriteAtomically(const std::string& path, const std::string& contents) {
  try {
    reports::WriteFileAtomically(path, contents);
  } catch (const std::runtime_error& error) {
    throw CheckpointError(error.what());
  }
}

std::string Fnv1a(const std::string& bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return fmt::format("{:016x}", hash);
}

reference::NamedTensors ParseTensorFile(const std::string& bytes, const std::string& path) {
  reference::NamedTensors tensors;
  try {
    const auto dict = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
    for (const auto& entry : dict) tensors.insert(entry.key().toStringRef(), entry.value().toTensor());
  } catch (const c10::Error& error) {
    throw CheckpointError(fmt::format("{}: not a checkpoint file of tensors: {}", path, error.what_without_backtrace()));
  }
  return tensors;
}

}  // namespace

std::string StageFileName(int stage) { return fmt::format("stage{}.pt", stage); }
std::string DataFileName(int replica) { return fmt::format("data.replica{}.pt", replica); }

std::string CheckpointKey(const std::string& part, const std::string& name) { return part + "/" + name; }

std::pair<std::string, std::string> SplitCheckpointKey(const std::string& key) {
  const auto slash = key.find('/');
  if (slash == std::string::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

void WriteTensorFile(const std::string& path, const reference::NamedTensors& tensors) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& item : tensors) dict.insert(item.key(), item.value().detach().cpu().contiguous());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  WriteAtomically(path, std::string(bytes.begin(), bytes.end()));
}

reference::NamedTensors ReadTensorFile(const std::string& path) { return ParseTensorFile(ReadBytes(path), path); }

void WriteManifest(const std::string& folder, CheckpointManifest manifest, const std::vector<std::string>& files) {
  manifest.files.clear();
  for (const auto& name : files) {
    const std::string path = (fs::path(folder) / name).string();
    if (!fs::exists(path)) throw CheckpointError(fmt::format("{}: not written, so the checkpoint is incomplete", path));
    const std::string bytes = ReadBytes(path);
    CheckpointFile file{name, static_cast<int64_t>(bytes.size()), Fnv1a(bytes), {}};
    for (const auto& item : ParseTensorFile(bytes, path)) file.keys.push_back(item.key());
    manifest.files.push_back(std::move(file));
  }
  json j = {{"pipecheck_checkpoint", kManifestFormat}, {"step", manifest.step}, {"stages", manifest.stages},
            {"replicas", manifest.replicas}, {"layout", manifest.layout}, {"files", json::array()}};
  for (const auto& file : manifest.files) {
    j["files"].push_back({{"name", file.name}, {"bytes", file.bytes}, {"fnv1a64", file.hash}, {"keys", file.keys}});
  }
  WriteAtomically((fs::path(folder) / kCheckpointManifest).string(), j.dump(1) + "\n");
}

CheckpointManifest ReadManifest(const std::string& folder) {
  const std::string path = (fs::path(folder) / kCheckpointManifest).string();
  if (!fs::exists(path)) {
    std::vector<std::string> present;
    if (fs::is_directory(folder)) {
      for (const auto& entry : fs::directory_iterator(folder)) present.push_back(entry.path().filename().string());
    }
    std::sort(present.begin(), present.end());
    throw CheckpointError(fmt::format(
        "{}: missing, so the checkpoint is incomplete (its writers did not all finish); the folder holds: {}", path,
        present.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(present, ", "))));
  }
  CheckpointManifest manifest;
  try {
    const json j = json::parse(ReadBytes(path));
    if (j.at("pipecheck_checkpoint").get<int>() != kManifestFormat) {
      throw CheckpointError(fmt::format("{}: a checkpoint of another format", path));
    }
    j.at("step").get_to(manifest.step);
    j.at("stages").get_to(manifest.stages);
    j.at("replicas").get_to(manifest.replicas);
    j.at("layout").get_to(manifest.layout);
    for (const auto& f : j.at("files")) {
      manifest.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(),
                                f.at("fnv1a64").get<std::string>(), f.at("keys").get<std::vector<std::string>>()});
    }
  } catch (const json::exception& error) {
    throw CheckpointError(fmt::format("{}: not a checkpoint manifest: {}", path, error.what()));
  }
  return manifest;
}

void VerifyFile(const std::string& folder, const CheckpointFile& file) {
  const std::string path = (fs::path(folder) / file.name).string();
  if (!fs::exists(path)) throw CheckpointError(fmt::format("{}: listed in the manifest but missing", path));
  const std::string bytes = ReadBytes(path);
  if (static_cast<int64_t>(bytes.size()) != file.bytes) {
    throw CheckpointError(fmt::format("{}: {} bytes where the manifest lists {} (truncated or rewritten)", path,
                                      bytes.size(), file.bytes));
  }
  const std::string hash = Fnv1a(bytes);
  if (hash != file.hash) {
    throw CheckpointError(
        fmt::format("{}: contents hash {} where the manifest lists {} (changed after it was written)", path, hash, file.hash));
  }
}

void CheckComplete(const std::string& folder, const CheckpointManifest& manifest) {
  std::vector<std::string> expected;
  for (int s = 0; s < manifest.stages; ++s) expected.push_back(StageFileName(s));
  for (int r = 0; r < manifest.replicas; ++r) expected.push_back(DataFileName(r));
  for (const auto& name : expected) {
    const bool listed = std::any_of(manifest.files.begin(), manifest.files.end(),
                                    [&](const CheckpointFile& file) { return file.name == name; });
    if (!listed) {
      throw CheckpointError(fmt::format("{}: a layout of {} stages and {} replicas writes {}, which the manifest does "
                                        "not list: the checkpoint is incomplete",
                                        (fs::path(folder) / kCheckpointManifest).string(), manifest.stages,
                                        manifest.replicas, name));
    }
  }
}

CheckpointContents ReadCheckpoint(const std::string& folder) {
  CheckpointContents contents;
  contents.manifest = ReadManifest(folder);
  const auto& manifest = contents.manifest;
  contents.data.resize(static_cast<size_t>(std::max(1, manifest.replicas)));
  CheckComplete(folder, manifest);
  std::map<std::string, std::string> holder;  // key -> the file that first held it
  for (const auto& file : manifest.files) {
    VerifyFile(folder, file);
    const std::string path = (fs::path(folder) / file.name).string();
    const auto tensors = ReadTensorFile(path);
    for (int r = 0; r < manifest.replicas; ++r) {
      if (file.name == DataFileName(r)) contents.data[static_cast<size_t>(r)] = tensors;
    }
    if (file.name.rfind("data.", 0) == 0) continue;
    for (const auto& item : tensors) {
      if (!contents.tensors.contains(item.key())) {
        contents.tensors.insert(item.key(), item.value());
        holder[item.key()] = file.name;
        continue;
      }
      const auto& first = contents.tensors[item.key()];
      if (!(first.sizes() == item.value().sizes() && first.dtype() == item.value().dtype() &&
            torch::equal(first, item.value()))) {
        throw CheckpointError(fmt::format("{}: {} differs from the copy in {} (a tied weight's two copies must be "
                                          "equal)", path, item.key(), holder[item.key()]));
      }
    }
  }
  return contents;
}

}  // namespace pipecheck::pipeline
