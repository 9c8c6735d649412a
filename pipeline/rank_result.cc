// Rank results and their trip to rank 0 (see rank_result.h).
#include "pipeline/rank_result.h"

#include <torch/serialize.h>

#include <algorithm>

namespace pipecheck::pipeline {

std::string RankResult::Who() const {
  return replicas > 1 ? "replica " + std::to_string(replica) + " rank " + std::to_string(rank)
                      : "rank " + std::to_string(rank);
}

std::vector<RankResult> ReplicaRanks(const std::vector<RankResult>& ranks, int replica) {
  std::vector<RankResult> mine;
  for (const auto& rank : ranks) {
    if (rank.replica == replica) mine.push_back(rank);
  }
  return mine;
}

std::string StageCopyKey(const std::string& name, int stage) { return name + "@stage" + std::to_string(stage); }

std::string ParameterName(const std::string& key) { return key.substr(0, key.find("@stage")); }

namespace {

// A message record travels as step, send, peer, tag, dtype, dims, bytes, then 8 sizes.
constexpr size_t kMessageFields = 7 + kMaxMessageDims;

c10::List<torch::Tensor> TensorsOf(const reference::NamedTensors& tensors) {
  c10::List<torch::Tensor> list;
  for (const auto& item : tensors) list.push_back(item.value().cpu());
  return list;
}

c10::List<std::string> NamesOf(const reference::NamedTensors& tensors) {
  c10::List<std::string> list;
  for (const auto& item : tensors) list.push_back(item.key());
  return list;
}

reference::NamedTensors Zip(const c10::List<std::string>& names, const c10::List<torch::Tensor>& tensors) {
  reference::NamedTensors named;
  for (size_t i = 0; i < names.size(); ++i) named.insert(names.get(i), tensors.get(i));
  return named;
}

// One NamedTensors per step, stored as KEY (lists of tensors) and KEY_names (lists of names).
void InsertPerStep(c10::impl::GenericDict& dict, const std::string& key, const std::vector<reference::NamedTensors>& steps) {
  c10::List<c10::List<torch::Tensor>> tensors;
  c10::List<c10::List<std::string>> names;
  for (const auto& step : steps) {
    tensors.push_back(TensorsOf(step));
    names.push_back(NamesOf(step));
  }
  dict.insert(key, tensors);
  dict.insert(key + "_names", names);
}

std::vector<reference::NamedTensors> PerStep(const c10::impl::GenericDict& dict, const std::string& key) {
  const auto tensors = dict.at(key).toList();
  const auto names = dict.at(key + "_names").toList();
  std::vector<reference::NamedTensors> steps;
  for (size_t i = 0; i < tensors.size(); ++i) {
    steps.push_back(Zip(c10::impl::toTypedList<std::string>(names.get(i).toList()),
                        c10::impl::toTypedList<torch::Tensor>(tensors.get(i).toList())));
  }
  return steps;
}

torch::Tensor Doubles(const std::vector<double>& values) {
  return torch::tensor(values.empty() ? std::vector<double>{} : values, torch::kFloat64);
}

std::vector<double> ToDoubles(const torch::Tensor& tensor) {
  auto contiguous = tensor.contiguous();
  return std::vector<double>(contiguous.data_ptr<double>(), contiguous.data_ptr<double>() + contiguous.numel());
}

}  // namespace

torch::Tensor SerializeRankResult(const RankResult& result) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("rank", static_cast<int64_t>(result.rank));
  dict.insert("replica", static_cast<int64_t>(result.replica));
  dict.insert("replicas", static_cast<int64_t>(result.replicas));
  std::vector<double> collectives;
  for (const auto& c : result.collectives) {
    collectives.insert(collectives.end(), {static_cast<double>(c.step), static_cast<double>(c.elements),
                                           static_cast<double>(c.bytes), static_cast<double>(c.replicas), c.start_us,
                                           c.end_us, c.step_start_us});
  }
  dict.insert("collectives", Doubles(collectives));
  dict.insert("stages", c10::List<int64_t>(std::vector<int64_t>(result.stages.begin(), result.stages.end())));
  dict.insert("losses", Doubles(result.losses));
  dict.insert("step_ms", Doubles(result.step_ms));
  dict.insert("timing_step_ms", Doubles(result.timing_step_ms));
  dict.insert("grad_norms", Doubles(result.grad_norms));
  dict.insert("peak_bytes", c10::List<int64_t>(result.peak_bytes));
  InsertPerStep(dict, "gradients", result.gradients);
  InsertPerStep(dict, "step_weights", result.weights);
  dict.insert("weights", TensorsOf(result.final_weights));
  dict.insert("weight_names", NamesOf(result.final_weights));
  std::vector<double> timeline;
  for (const auto& t : result.timeline) {
    timeline.insert(timeline.end(), {static_cast<double>(t.step), static_cast<double>(t.action.kind),
                                     static_cast<double>(t.action.stage), static_cast<double>(t.action.microbatch),
                                     t.start_us, t.end_us, static_cast<double>(t.held_bytes),
                                     static_cast<double>(t.peak_bytes), t.wait_start_us, t.step_start_us});
  }
  dict.insert("timeline", Doubles(timeline));
  std::vector<double> boundaries;
  std::vector<int64_t> hashes;
  for (const auto& b : result.boundaries) {
    const auto& f = b.fingerprint;
    boundaries.insert(boundaries.end(), {static_cast<double>(b.step), static_cast<double>(b.microbatch),
                                         static_cast<double>(b.stage), static_cast<double>(b.direction),
                                         static_cast<double>(b.role), static_cast<double>(b.peer), f.sum, f.norm,
                                         f.max_abs, f.row_weighted_sum, static_cast<double>(f.numel),
                                         static_cast<double>(f.rows), f.hashed ? 1.0 : 0.0});
    hashes.push_back(static_cast<int64_t>(f.hash));
  }
  dict.insert("boundaries", Doubles(boundaries));
  dict.insert("boundary_hashes", c10::List<int64_t>(hashes));
  std::vector<int64_t> messages;
  for (const auto& m : result.messages) {
    std::vector<int64_t> fields = {m.step, m.send ? 1 : 0, m.peer, m.tag, static_cast<int64_t>(m.shape.dtype),
                                   static_cast<int64_t>(m.shape.sizes.size()), m.bytes};
    fields.resize(kMessageFields - kMaxMessageDims, 0);
    for (int d = 0; d < kMaxMessageDims; ++d) {
      fields.push_back(d < static_cast<int>(m.shape.sizes.size()) ? m.shape.sizes[d] : 0);
    }
    messages.insert(messages.end(), fields.begin(), fields.end());
  }
  dict.insert("messages", c10::List<int64_t>(messages));
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  return torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

RankResult DeserializeRankResult(const torch::Tensor& bytes) {
  auto contiguous = bytes.contiguous();
  const char* data = reinterpret_cast<const char*>(contiguous.data_ptr<uint8_t>());
  const auto dict = torch::pickle_load(std::vector<char>(data, data + contiguous.numel())).toGenericDict();
  RankResult result;
  result.rank = static_cast<int>(dict.at("rank").toInt());
  result.replica = static_cast<int>(dict.at("replica").toInt());
  result.replicas = static_cast<int>(dict.at("replicas").toInt());
  const auto collectives = ToDoubles(dict.at("collectives").toTensor());
  for (size_t i = 0; i + 7 <= collectives.size(); i += 7) {
    const double* c = collectives.data() + i;
    result.collectives.push_back({static_cast<int64_t>(c[0]), static_cast<int64_t>(c[1]), static_cast<int64_t>(c[2]),
                                  static_cast<int>(c[3]), c[4], c[5], c[6]});
  }
  for (int64_t stage : dict.at("stages").toIntVector()) result.stages.push_back(static_cast<int>(stage));
  result.losses = ToDoubles(dict.at("losses").toTensor());
  result.step_ms = ToDoubles(dict.at("step_ms").toTensor());
  if (dict.contains("timing_step_ms")) result.timing_step_ms = ToDoubles(dict.at("timing_step_ms").toTensor());
  result.grad_norms = ToDoubles(dict.at("grad_norms").toTensor());
  result.peak_bytes = dict.at("peak_bytes").toIntVector();
  result.gradients = PerStep(dict, "gradients");
  result.weights = PerStep(dict, "step_weights");
  result.final_weights = Zip(c10::impl::toTypedList<std::string>(dict.at("weight_names").toList()),
                             c10::impl::toTypedList<torch::Tensor>(dict.at("weights").toList()));
  const auto timeline = ToDoubles(dict.at("timeline").toTensor());
  constexpr size_t kFields = 10;
  for (size_t i = 0; i + kFields <= timeline.size(); i += kFields) {
    Action action{static_cast<ActionKind>(static_cast<int>(timeline[i + 1])), static_cast<int>(timeline[i + 2]),
                  static_cast<int>(timeline[i + 3])};
    result.timeline.push_back({static_cast<int64_t>(timeline[i]), action, timeline[i + 4], timeline[i + 5],
                               static_cast<int64_t>(timeline[i + 6]), static_cast<int64_t>(timeline[i + 7]),
                               timeline[i + 8], timeline[i + 9]});
  }
  const auto boundaries = ToDoubles(dict.at("boundaries").toTensor());
  const auto hashes = dict.at("boundary_hashes").toIntVector();
  constexpr size_t kBoundaryFields = 13;
  for (size_t i = 0, k = 0; i + kBoundaryFields <= boundaries.size(); i += kBoundaryFields, ++k) {
    const double* b = boundaries.data() + i;
    BoundaryRecord record{static_cast<int64_t>(b[0]), static_cast<int>(b[1]), static_cast<int>(b[2]),
                          static_cast<Direction>(static_cast<int>(b[3])), static_cast<BoundaryRole>(static_cast<int>(b[4])),
                          static_cast<int>(b[5]), {}};
    record.fingerprint = {b[6], b[7], b[8], b[9], static_cast<int64_t>(b[10]), static_cast<int64_t>(b[11]),
                          b[12] != 0.0, static_cast<uint64_t>(hashes.at(k))};
    result.boundaries.push_back(record);
  }
  const auto messages = dict.at("messages").toIntVector();
  for (size_t i = 0; i + kMessageFields <= messages.size(); i += kMessageFields) {
    const int64_t* m = messages.data() + i;
    const int64_t dims = std::min<int64_t>(std::max<int64_t>(m[5], 0), kMaxMessageDims);
    const int64_t* sizes = m + kMessageFields - kMaxMessageDims;
    result.messages.push_back({m[0], m[1] != 0, static_cast<int>(m[2]), static_cast<int>(m[3]),
                               MessageShape{static_cast<torch::ScalarType>(m[4]), std::vector<int64_t>(sizes, sizes + dims)},
                               m[6]});
  }
  return result;
}

namespace {

// Every member's `own` results on member 0 of `transport`, member by member, each member's in its
// order (every member holds the same count); an empty vector elsewhere. Result i of member r
// travels as the message (result, r, i); member 0 acknowledges with (result, r, count).
// A member leaves only once member 0 says its results arrived. A sender's Wait() ends when its
// bytes are in the socket, not when they are read: a rank that exited then could close its end
// while rank 0 still had the message (or Gloo's own notices) in flight, and rank 0's read failed
// with "Connection reset by peer" (seen once in 700 scenario runs of the long sweep, two at a time
// on 2 cores). Member 0 reads nothing after the acknowledgements, so a peer's exit cannot cut it
// off.
std::vector<RankResult> GatherLists(Transport& transport, std::vector<RankResult> own) {
  const int member = transport.rank();
  const int count = static_cast<int>(own.size());
  if (member != 0) {
    for (int i = 0; i < count; ++i) {
      transport.Send(SerializeRankResult(own[i]), 0, MessageTag(Direction::kResult, member, i), std::nullopt)->Wait();
    }
    transport.Recv(0, MessageTag(Direction::kResult, member, count), torch::kCPU, std::nullopt)->Wait();
    return {};
  }
  std::vector<RankResult> results = std::move(own);
  for (int peer = 1; peer < transport.world_size(); ++peer) {
    for (int i = 0; i < count; ++i) {
      auto bytes = transport.Recv(peer, MessageTag(Direction::kResult, peer, i), torch::kCPU, std::nullopt)->Wait();
      results.push_back(DeserializeRankResult(bytes));
    }
  }
  for (int peer = 1; peer < transport.world_size(); ++peer) {
    transport.Send(torch::zeros({1}, torch::kUInt8), peer, MessageTag(Direction::kResult, peer, count), std::nullopt)
        ->Wait();
  }
  return results;
}

}  // namespace

std::vector<RankResult> GatherResults(Transport& transport, RankResult own) {
  std::vector<RankResult> mine;
  mine.push_back(std::move(own));
  return GatherLists(transport, std::move(mine));
}

std::vector<RankResult> GatherReplicas(Transport& replicas, std::vector<RankResult> own) {
  return GatherLists(replicas, std::move(own));
}

}  // namespace pipecheck::pipeline
