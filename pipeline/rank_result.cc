// Rank results and their trip to rank 0 (see rank_result.h).
#include "pipeline/rank_result.h"

#include <torch/serialize.h>

namespace pipecheck::pipeline {

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

}  // namespace

torch::Tensor SerializeRankResult(const RankResult& result) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("rank", static_cast<int64_t>(result.rank));
  dict.insert("stages", c10::List<int64_t>(std::vector<int64_t>(result.stages.begin(), result.stages.end())));
  dict.insert("losses", Doubles(result.losses));
  dict.insert("step_ms", Doubles(result.step_ms));
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
                                     t.start_us, t.end_us, static_cast<double>(t.held_bytes), t.wait_start_us,
                                     t.step_start_us});
  }
  dict.insert("timeline", Doubles(timeline));
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  return torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

RankResult DeserializeRankResult(const torch::Tensor& bytes) {
  auto contiguous = bytes.contiguous();
  const char* data = reinterpret_cast<const char*>(contiguous.data_ptr<uint8_t>());
  const auto dict = torch::pickle_load(std::vector<char>(data, data + contiguous.numel())).toGenericDict();
  RankResult result;
  result.rank = static_cast<int>(dict.at("rank").toInt());
  for (int64_t stage : dict.at("stages").toIntVector()) result.stages.push_back(static_cast<int>(stage));
  result.losses = ToDoubles(dict.at("losses").toTensor());
  result.step_ms = ToDoubles(dict.at("step_ms").toTensor());
  result.grad_norms = ToDoubles(dict.at("grad_norms").toTensor());
  result.peak_bytes = dict.at("peak_bytes").toIntVector();
  result.gradients = PerStep(dict, "gradients");
  result.weights = PerStep(dict, "step_weights");
  result.final_weights = Zip(c10::impl::toTypedList<std::string>(dict.at("weight_names").toList()),
                             c10::impl::toTypedList<torch::Tensor>(dict.at("weights").toList()));
  const auto timeline = ToDoubles(dict.at("timeline").toTensor());
  constexpr size_t kFields = 9;
  for (size_t i = 0; i + kFields <= timeline.size(); i += kFields) {
    Action action{static_cast<ActionKind>(static_cast<int>(timeline[i + 1])), static_cast<int>(timeline[i + 2]),
                  static_cast<int>(timeline[i + 3])};
    result.timeline.push_back({static_cast<int64_t>(timeline[i]), action, timeline[i + 4], timeline[i + 5],
                               static_cast<int64_t>(timeline[i + 6]), timeline[i + 7], timeline[i + 8]});
  }
  return result;
}

std::vector<RankResult> GatherResults(Transport& transport, RankResult own) {
  if (transport.rank() != 0) {
    transport.Send(SerializeRankResult(own), 0, MessageTag(Direction::kResult, transport.rank(), 0), std::nullopt)
        ->Wait();
    return {};
  }
  std::vector<RankResult> results;
  results.push_back(std::move(own));
  for (int rank = 1; rank < transport.world_size(); ++rank) {
    auto bytes = transport.Recv(rank, MessageTag(Direction::kResult, rank, 0), torch::kCPU, std::nullopt)->Wait();
    results.push_back(DeserializeRankResult(bytes));
  }
  return results;
}

}  // namespace pipecheck::pipeline
