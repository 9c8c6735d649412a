// Rank results and their trip to rank 0 (see rank_result.h).
#include "pipeline/rank_result.h"

#include <torch/serialize.h>

#include <algorithm>
#include <stdexcept>

#include "pipeline/record_columns.h"

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

std::string ExpertCountsName(int64_t layer) { return "layers." + std::to_string(layer) + ".feed_forward.expert_counts"; }

std::string RoutingName(int64_t layer, int microbatch) {
  return "layers." + std::to_string(layer) + ".feed_forward.routing/" + std::to_string(microbatch);
}

int RoutingMicrobatch(const std::string& name) {
  const auto slash = name.rfind('/');
  return slash == std::string::npos ? -1 : std::stoi(name.substr(slash + 1));
}

std::string StageCopyKey(const std::string& name, int stage) { return name + "@stage" + std::to_string(stage); }

std::string ParameterName(const std::string& key) { return key.substr(0, key.find("@stage")); }

namespace {

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

// A field of R read and written as int64 through a member (or a member's member) of type T.
#define PIPECHECK_WHOLE(R, name, member, T) \
  WholeField<R>(name, [](const R& r) { return static_cast<int64_t>(r.member); }, \
                [](R& r, int64_t v) { r.member = static_cast<T>(v); })
#define PIPECHECK_REAL(R, name, member) \
  RealField<R>(name, [](const R& r) { return r.member; }, [](R& r, double v) { r.member = v; })

const std::vector<RecordField<CollectiveRecord>>& CollectiveFields() {
  static const std::vector<RecordField<CollectiveRecord>> fields = {
      PIPECHECK_WHOLE(CollectiveRecord, "step", step, int64_t),
      PIPECHECK_WHOLE(CollectiveRecord, "elements", elements, int64_t),
      PIPECHECK_WHOLE(CollectiveRecord, "bytes", bytes, int64_t),
      PIPECHECK_WHOLE(CollectiveRecord, "replicas", replicas, int),
      PIPECHECK_REAL(CollectiveRecord, "start_us", start_us),
      PIPECHECK_REAL(CollectiveRecord, "end_us", end_us),
      PIPECHECK_REAL(CollectiveRecord, "step_start_us", step_start_us),
  };
  return fields;
}

const std::vector<RecordField<ActionTiming>>& ActionTimingFields() {
  static const std::vector<RecordField<ActionTiming>> fields = {
      PIPECHECK_WHOLE(ActionTiming, "step", step, int64_t),
      PIPECHECK_WHOLE(ActionTiming, "kind", action.kind, ActionKind),
      PIPECHECK_WHOLE(ActionTiming, "stage", action.stage, int),
      PIPECHECK_WHOLE(ActionTiming, "microbatch", action.microbatch, int),
      PIPECHECK_REAL(ActionTiming, "start_us", start_us),
      PIPECHECK_REAL(ActionTiming, "end_us", end_us),
      PIPECHECK_WHOLE(ActionTiming, "held_bytes", held_bytes, int64_t),
      PIPECHECK_WHOLE(ActionTiming, "peak_bytes", peak_bytes, int64_t),
      PIPECHECK_REAL(ActionTiming, "wait_start_us", wait_start_us),
      PIPECHECK_REAL(ActionTiming, "step_start_us", step_start_us),
  };
  return fields;
}

const std::vector<RecordField<BoundaryRecord>>& BoundaryFields() {
  static const std::vector<RecordField<BoundaryRecord>> fields = {
      PIPECHECK_WHOLE(BoundaryRecord, "step", step, int64_t),
      PIPECHECK_WHOLE(BoundaryRecord, "microbatch", microbatch, int),
      PIPECHECK_WHOLE(BoundaryRecord, "stage", stage, int),
      PIPECHECK_WHOLE(BoundaryRecord, "direction", direction, Direction),
      PIPECHECK_WHOLE(BoundaryRecord, "role", role, BoundaryRole),
      PIPECHECK_WHOLE(BoundaryRecord, "peer", peer, int),
      PIPECHECK_REAL(BoundaryRecord, "sum", fingerprint.sum),
      PIPECHECK_REAL(BoundaryRecord, "norm", fingerprint.norm),
      PIPECHECK_REAL(BoundaryRecord, "max_abs", fingerprint.max_abs),
      PIPECHECK_REAL(BoundaryRecord, "row_weighted_sum", fingerprint.row_weighted_sum),
      PIPECHECK_WHOLE(BoundaryRecord, "numel", fingerprint.numel, int64_t),
      PIPECHECK_WHOLE(BoundaryRecord, "rows", fingerprint.rows, int64_t),
      PIPECHECK_WHOLE(BoundaryRecord, "hashed", fingerprint.hashed, bool),
      PIPECHECK_WHOLE(BoundaryRecord, "hash", fingerprint.hash, uint64_t),
  };
  return fields;
}

const std::vector<RecordField<MessageRecord>>& MessageFields() {
  static const std::vector<RecordField<MessageRecord>> fields = [] {
    std::vector<RecordField<MessageRecord>> list = {
        PIPECHECK_WHOLE(MessageRecord, "step", step, int64_t),
        PIPECHECK_WHOLE(MessageRecord, "send", send, bool),
        PIPECHECK_WHOLE(MessageRecord, "peer", peer, int),
        PIPECHECK_WHOLE(MessageRecord, "tag", tag, int),
        PIPECHECK_WHOLE(MessageRecord, "dtype", shape.dtype, torch::ScalarType),
        PIPECHECK_WHOLE(MessageRecord, "bytes", bytes, int64_t),
        WholeField<MessageRecord>(
            "dims", [](const MessageRecord& m) { return static_cast<int64_t>(m.shape.sizes.size()); },
            [](MessageRecord& m, int64_t dims) {
              if (dims < 0 || dims > kMaxMessageDims) throw std::runtime_error("message record: " + std::to_string(dims) + " dims");
              m.shape.sizes.resize(static_cast<size_t>(dims), 0);
            }),
    };
    // Sizes past a message's dims are 0 and dropped; "dims" comes first, so they have a place.
    for (int d = 0; d < kMaxMessageDims; ++d) {
      list.push_back(WholeField<MessageRecord>(
          "size" + std::to_string(d),
          [d](const MessageRecord& m) { return d < static_cast<int>(m.shape.sizes.size()) ? m.shape.sizes[d] : int64_t{0}; },
          [d](MessageRecord& m, int64_t size) {
            if (d < static_cast<int>(m.shape.sizes.size())) m.shape.sizes[d] = size;
          }));
    }
    return list;
  }();
  return fields;
}

#undef PIPECHECK_WHOLE
#undef PIPECHECK_REAL

}  // namespace

torch::Tensor SerializeRankResult(const RankResult& result) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("rank", static_cast<int64_t>(result.rank));
  dict.insert("replica", static_cast<int64_t>(result.replica));
  dict.insert("replicas", static_cast<int64_t>(result.replicas));
  dict.insert("stages", c10::List<int64_t>(std::vector<int64_t>(result.stages.begin(), result.stages.end())));
  dict.insert("losses", Doubles(result.losses));
  dict.insert("aux_losses", Doubles(result.aux_losses));
  dict.insert("step_ms", Doubles(result.step_ms));
  dict.insert("timing_step_ms", Doubles(result.timing_step_ms));
  dict.insert("grad_norms", Doubles(result.grad_norms));
  dict.insert("peak_bytes", c10::List<int64_t>(result.peak_bytes));
  InsertPerStep(dict, "gradients", result.gradients);
  InsertPerStep(dict, "step_weights", result.weights);
  InsertPerStep(dict, "master_weights", result.master_weights);
  dict.insert("weights", TensorsOf(result.final_weights));
  dict.insert("weight_names", NamesOf(result.final_weights));
  InsertPerStep(dict, "step_expert_biases", result.expert_biases);
  InsertPerStep(dict, "step_expert_counts", result.expert_counts);
  InsertPerStep(dict, "step_routing", result.routing);
  dict.insert("expert_biases", TensorsOf(result.final_expert_biases));
  dict.insert("expert_bias_names", NamesOf(result.final_expert_biases));
  dict.insert("first_step", result.first_step);
  dict.insert("loaded", TensorsOf(result.loaded));
  dict.insert("loaded_names", NamesOf(result.loaded));
  dict.insert("collectives", PackRecords(result.collectives, CollectiveFields()));
  dict.insert("timeline", PackRecords(result.timeline, ActionTimingFields()));
  dict.insert("boundaries", PackRecords(result.boundaries, BoundaryFields()));
  dict.insert("messages", PackRecords(result.messages, MessageFields()));
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
  for (int64_t stage : dict.at("stages").toIntVector()) result.stages.push_back(static_cast<int>(stage));
  result.losses = ToDoubles(dict.at("losses").toTensor());
  result.aux_losses = ToDoubles(dict.at("aux_losses").toTensor());
  result.step_ms = ToDoubles(dict.at("step_ms").toTensor());
  result.timing_step_ms = ToDoubles(dict.at("timing_step_ms").toTensor());
  result.grad_norms = ToDoubles(dict.at("grad_norms").toTensor());
  result.peak_bytes = dict.at("peak_bytes").toIntVector();
  result.gradients = PerStep(dict, "gradients");
  result.weights = PerStep(dict, "step_weights");
  result.master_weights = PerStep(dict, "master_weights");
  result.final_weights = Zip(c10::impl::toTypedList<std::string>(dict.at("weight_names").toList()),
                             c10::impl::toTypedList<torch::Tensor>(dict.at("weights").toList()));
  result.expert_biases = PerStep(dict, "step_expert_biases");
  result.expert_counts = PerStep(dict, "step_expert_counts");
  result.routing = PerStep(dict, "step_routing");
  result.final_expert_biases = Zip(c10::impl::toTypedList<std::string>(dict.at("expert_bias_names").toList()),
                                   c10::impl::toTypedList<torch::Tensor>(dict.at("expert_biases").toList()));
  result.first_step = dict.at("first_step").toInt();
  result.loaded = Zip(c10::impl::toTypedList<std::string>(dict.at("loaded_names").toList()),
                      c10::impl::toTypedList<torch::Tensor>(dict.at("loaded").toList()));
  const std::string who = result.Who() + "'s ";
  result.collectives = UnpackRecords(dict.at("collectives").toGenericDict(), CollectiveFields(), who + "collectives");
  result.timeline = UnpackRecords(dict.at("timeline").toGenericDict(), ActionTimingFields(), who + "timeline");
  result.boundaries = UnpackRecords(dict.at("boundaries").toGenericDict(), BoundaryFields(), who + "boundaries");
  result.messages = UnpackRecords(dict.at("messages").toGenericDict(), MessageFields(), who + "messages");
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
