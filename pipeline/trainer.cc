// The pipeline trainer (see trainer.h).
#include "pipeline/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <filesystem>

#include "pipeline/checkpoint.h"
#include "pipeline/gradient_sync.h"
#include "pipeline/lowering.h"
#include "pipeline/message.h"
#include "pipeline/schedule_csv.h"
#include "pipeline/schedule_name.h"
#include "reference/host_memory.h"

namespace pipecheck::pipeline {

namespace {
std::atomic<int64_t> g_schedules_built{0};
}  // namespace

int64_t SchedulesBuilt() { return g_schedules_built.load(); }

Schedule TrainerRound(const std::string& schedule, const PipelineShape& round) {
  Schedule named = ScheduleByName(schedule, round);
  return IsScheduleCsv(schedule) ? named : SplitDrainBackwards(named);
}

std::optional<Schedule> LoweredScheduleWithin(const PipelineConfig& config, int64_t budget) {
  ++g_schedules_built;
  TORCH_CHECK(config.accumulation >= 1 && config.microbatches % config.accumulation == 0, "microbatches ",
              config.microbatches, " are not ", config.accumulation, " rounds of the same count");
  const PipelineShape round{config.world_size, config.virtual_stages, config.microbatches / config.accumulation};
  return LowerScheduleWithin(RepeatRounds(TrainerRound(config.schedule, round), config.accumulation), budget,
                             SeamsFor(config, 0).post_receives_first);
}

Schedule BuildSchedule(const PipelineConfig& config) {
  Schedule lowered = *LoweredScheduleWithin(config, -1);
  ValidateSchedule(lowered, {}, config.communication);
  return lowered;
}

std::vector<std::pair<int, int>> MessageChannels(const PipelineConfig& config, const Schedule& schedule) {
  std::vector<std::pair<int, int>> channels = TiedChannels(config, schedule.shape);
  for (int r = 0; r < schedule.shape.ranks; ++r) {
    for (const Action& action : schedule.ranks[r]) {
      if (action.IsSend()) channels.emplace_back(r, PeerOf(schedule.shape, action));
    }
  }
  std::sort(channels.begin(), channels.end());
  channels.erase(std::unique(channels.begin(), channels.end()), channels.end());
  return channels;
}

PipelineTrainer::PipelineTrainer(const PipelineConfig& config, Transport& transport, Transport* replicas)
    : PipelineTrainer(config, BuildSchedule(config), transport, replicas) {}

PipelineTrainer::PipelineTrainer(const PipelineConfig& config, Schedule schedule, Transport& transport,
                                 Transport* replicas)
    : config_(config), transport_(transport), replicas_(config.data_parallel > 1 ? replicas : nullptr),
      seams_(SeamsFor(config, transport.rank())), messages_(seams_.wrap_messages(transport_)),
      schedule_(std::move(schedule)), baseline_bytes_(reference::HeldTensorBytes(config.train.device)),
      replica_(config.replica), data_position_(config.first_step) {
  TORCH_CHECK(transport.world_size() == config.world_size, "the scenario has world_size ", config.world_size,
              " but ", transport.world_size(), " ranks were started");
  TORCH_CHECK(config.data_parallel == 1 || (replicas != nullptr && replicas->world_size() == config.data_parallel),
              "the scenario has data_parallel ", config.data_parallel, " but this rank's data-parallel group has ",
              replicas == nullptr ? 1 : replicas->world_size(), " replicas");
  reference::CheckDtypeSupported(config.train.dtype, config.train.device);
  stages_ = BuildStages(config, schedule_.shape, transport.rank());
  for (const auto& stage : stages_) {
    owns_moe_layers_ = owns_moe_layers_ || config.train.model.MoeLayersIn(stage->slice.first_layer, stage->slice.end_layer) > 0;
  }
  accumulator_ = std::make_unique<reference::GradientAccumulator>(OwnedParameters());
  executor_ = std::make_unique<Executor>(config_, schedule_, stages_, *messages_, *seams_.tensors, *seams_.observer,
                                         *accumulator_);
  recorder_ = config.flight_record.empty() ? std::make_unique<FlightRecorder>()
                                           : std::make_unique<FlightRecorder>(config.flight_record);
  executor_->SetFlightRecorder(recorder_.get());
}

double PipelineTrainer::StepStartMicroseconds(const RankResult& result, int64_t step) const {
  for (auto it = result.timeline.rbegin(); it != result.timeline.rend(); ++it) {
    if (it->step == step) return it->step_start_us;
  }
  return 0.0;
}

void PipelineTrainer::AverageReplicas(int64_t step, RankResult& result, const GradientStage& average) {
  if (replicas_ == nullptr || averaged_this_step_) return;
  averaged_this_step_ = true;
  const double start = executor_->HostMicroseconds();
  const auto parameters = pipeline::OwnedParameters(stages_, config_.train.model.tied, average.tied_copy_averaged);
  const auto traffic = AverageAcrossReplicas(parameters, TiedCopies(stages_, config_), *replicas_, replica_buckets_,
                                             /*sparse=*/config_.train.model.HasExperts(), average.unrouted_skipped);
  const double end = executor_->HostMicroseconds();
  const double step_start = StepStartMicroseconds(result, step);
  result.collectives.push_back({step, traffic.elements, traffic.bytes, config_.data_parallel, start - step_start,
                                end - step_start, step_start});
}

void PipelineTrainer::RecordPhase(int64_t step, const std::string& what, int peer) {
  recorder_->Started(step, what, peer, executor_->HostMicroseconds());
}

void PipelineTrainer::EndPhase() { recorder_->Ended(executor_->HostMicroseconds()); }

PipelineTrainer::~PipelineTrainer() = default;

std::vector<torch::Tensor> PipelineTrainer::OwnedParameters() const {
  return pipeline::OwnedParameters(stages_, config_.train.model.tied, /*count_tied_copy=*/true);
}

namespace {

void Record(reference::NamedTensors& into, const std::string& name, int stage, const torch::Tensor& tensor) {
  into.insert(into.contains(name) ? StageCopyKey(name, stage) : name, reference::RecordedCopy(tensor));
}

}  // namespace

reference::NamedTensors PipelineTrainer::WeightCopies() const {
  reference::NamedTensors weights;
  for (const auto& stage : stages_) {
    for (const auto& item : stage->module->named_parameters()) Record(weights, item.key(), stage->index, item.value());
  }
  return weights;
}

reference::NamedTensors PipelineTrainer::BiasCopies() const {
  reference::NamedTensors biases;
  for (const auto& stage : stages_) {
    for (const auto& item : stage->module->named_buffers()) Record(biases, item.key(), stage->index, item.value());
  }
  return biases;
}

reference::NamedTensors PipelineTrainer::MoveExpertBiases(const std::map<int64_t, torch::Tensor>& counts) {
  const double gamma = config_.train.model.expert_bias;
  reference::NamedTensors used;
  if (gamma <= 0.0) return used;
  std::vector<torch::Tensor> biases;
  std::vector<torch::Tensor> rows;  // each bias's layer's counts
  std::vector<std::string> names;
  for (const auto& stage : stages_) {
    for (const auto& item : stage->module->named_buffers()) {
      const int64_t layer = reference::LayerOfName(item.key());
      const auto found = counts.find(layer);
      TORCH_CHECK(found != counts.end(), "rank ", transport_.rank(), " has no routing counts for ", item.key());
      biases.push_back(item.value());
      rows.push_back(found->second);
      names.push_back(ExpertCountsName(layer));
    }
  }
  if (biases.empty()) return used;  // no MoE layer here (every replica's same rank holds the same stages)
  // One all-reduce for every layer's counts: the whole batch's, over every replica.
  auto table = torch::stack(rows).to(torch::kCPU, torch::kInt64).contiguous();  // (layers, E)
  if (replicas_ != nullptr && seams_.tensors->CountsSummedOverReplicas()) replicas_->AllReduceSum(table);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < biases.size(); ++i) {
    const auto row = table[static_cast<int64_t>(i)];
    biases[i].copy_(reference::MovedExpertBias(biases[i], row, gamma));
    if (!used.contains(names[i])) used.insert(names[i], row.clone());
  }
  return used;
}

reference::NamedTensors PipelineTrainer::RoutingCopies() const {
  reference::NamedTensors routing;
  for (const auto& [at, chosen] : executor_->LastRouting()) {
    routing.insert(RoutingName(at.first, at.second), reference::RecordedCopy(chosen));
  }
  return routing;
}

reference::NamedTensors PipelineTrainer::GradientCopies() const {
  reference::NamedTensors gradients;
  for (const auto& stage : stages_) {
    for (const auto& item : stage->module->named_parameters()) {
      if (item.value().grad().defined()) Record(gradients, item.key(), stage->index, item.value().grad());
    }
  }
  return gradients;
}

void PipelineTrainer::RunGradientStage(const GradientStage& stage, int64_t step, RankResult& result,
                                       std::chrono::steady_clock::time_point started) {
  switch (stage.op) {
    case GradientOp::kTiedSum:
      SyncTiedGradients(stages_, config_, schedule_.shape, transport_);
      return;
    case GradientOp::kReplicaAverage:
      AverageReplicas(step, result, stage);
      return;
    case GradientOp::kClip:
      result.grad_norms.push_back(ClipGradients(stages_, config_, stage, transport_));
      return;
    case GradientOp::kOptimizerStep:  // a fresh_optimizer one was made fresh as the step began
      for (auto& owned : stages_) reference::DeterministicStep(*owned->optimizer);
      return;
    case GradientOp::kTransform:
      stage.transform(GradientContext{OwnedParameters(), started});
      return;
  }
}

// One clock for every rank, from the moment rank 0 leaves a barrier all ranks pass. On rank 0's
// host the steady clock is one clock for all processes, so its ranks read rank 0's moment off it
// exactly, however late the scheduler lets them out of the barrier; a rank on another host
// counts from the moment it left the barrier itself (off by that barrier's exit skew).
void PipelineTrainer::AlignClocks() {
  using Clock = std::chrono::steady_clock;
  transport_.Barrier();
  const Clock::time_point left = Clock::now();
  const auto microseconds = [](Clock::time_point t) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count());
  };
  std::array<char, 256> name{};
  gethostname(name.data(), name.size() - 1);
  const double host = static_cast<double>(std::hash<std::string>{}(name.data()) & ((uint64_t{1} << 52) - 1));
  const auto lefts = transport_.AllGather(microseconds(left));
  const auto hosts = transport_.AllGather(host);
  const int rank = transport_.rank();
  const auto rank0_left = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::microseconds(static_cast<int64_t>(lefts[0]))));
  executor_->SetClockOrigin(hosts[rank] == hosts[0] ? rank0_left : left);
}

void PipelineTrainer::Step(int64_t step, RankResult& result, bool judged) {
  const auto started = std::chrono::steady_clock::now();
  if (config_.train.record_gradients && judged) {
    result.weights.push_back(WeightCopies());
    if (config_.train.model.expert_bias > 0.0) result.expert_biases.push_back(BiasCopies());
  }
  accumulator_->Begin();
  transport_.Start(step);
  // The gradient path runs up to its optimizer step once the actions are done, the rest after the
  // step's record is taken. A fresh optimizer, if the path asks for one, is made before the
  // step's memory is metered (the old moments freed first).
  auto& path = seams_.gradient_path;
  const auto tail = std::find_if(path.begin(), path.end(),
                                 [](const GradientStage& stage) { return stage.op == GradientOp::kOptimizerStep; });
  if (tail != path.end() && tail->fresh_optimizer) {
    for (auto& stage : stages_) stage->optimizer = reference::MakeOptimizer(config_.train.optimizer, stage->parameters);
  }
  reference::StepWindow window(baseline_bytes_, config_.train.device);
  const auto batch = reference::MakeBatch(config_.train.data, config_.train.seed, judged ? data_position_ : step);
  if (judged) ++data_position_;
  averaged_this_step_ = false;
  const GradientStage* average = Find(path, GradientOp::kReplicaAverage);
  if (replicas_ != nullptr && average != nullptr && average->after_first_microbatch) {
    executor_->SetAfterBackward([&](const Action& action) {
      if (action.microbatch == 0) AverageReplicas(step, result, *average);
    });
  }
  const bool bias_moved_early = config_.train.model.expert_bias > 0.0 && seams_.tensors->BiasMovedAfterForwards();
  reference::NamedTensors counts_used;  // the routing counts that moved the expert biases
  if (bias_moved_early) {
    executor_->SetAfterForwards([&](const auto& counts) { counts_used = MoveExpertBiases(counts); });
  }
  torch::Tensor loss = executor_->Run(step, batch, window, result.timeline, result.boundaries);
  executor_->SetAfterBackward({});
  executor_->SetAfterForwards({});
  accumulator_->Finish();
  RecordPhase(step, "gradient_sync", -1);  // tied sums and the clipping norm: collectives with every owner
  for (auto stage = path.begin(); stage != tail; ++stage) RunGradientStage(*stage, step, result, started);
  EndPhase();
  if (replicas_ != nullptr && loss.defined()) {
    // The step's loss over the whole global batch: the replicas' terms (each over the whole
    // batch's denominator) summed, as their gradients are.
    auto total = loss.reshape({1}).to(torch::kCPU, torch::kFloat64).contiguous();
    replicas_->AllReduceSum(total);
    loss = total[0];
  }
  // The balance loss (mixture of experts) is made on every stage with an MoE layer: its terms
  // are summed over the pipeline's ranks and then the replicas (each over the whole batch's B),
  // and join the head's cross entropy in the step's reported loss.
  double aux_total = std::numeric_limits<double>::quiet_NaN();
  if (config_.train.model.HasExperts()) {
    const auto& aux = executor_->LastAuxSum();
    double sum = 0.0;
    for (double value : transport_.AllGather(aux.defined() ? aux.item<double>() : 0.0)) sum += value;
    if (replicas_ != nullptr) {
      auto total = torch::tensor({sum}, torch::kFloat64);
      replicas_->AllReduceSum(total);
      sum = total[0].item<double>();
    }
    aux_total = seams_.tensors->ReportedBalanceLoss(sum, owns_moe_layers_);
    if (loss.defined()) loss = loss.to(torch::kCPU, torch::kFloat64) + aux_total;
  }
  const auto messages = transport_.Stop();
  result.messages.insert(result.messages.end(), messages.begin(), messages.end());
  if (config_.train.record_gradients && judged) {  // a pause waits for the device: only for copies
    window.PauseForCopies();
    result.gradients.push_back(GradientCopies());
    if (config_.train.model.HasExperts()) result.routing.push_back(RoutingCopies());
    window.ResumeAfterCopies();
  }
  reference::GradientsToParameterDtype(OwnedParameters());
  for (auto stage = tail; stage != path.end(); ++stage) RunGradientStage(*stage, step, result, started);
  // Auxiliary-loss-free balancing: the expert biases move after the optimizer step, by the step's
  // routing counts over the whole batch (every microbatch once, every replica).
  if (!bias_moved_early) counts_used = MoveExpertBiases(executor_->LastExpertCounts());
  if (config_.train.model.expert_bias > 0.0 && judged) result.expert_counts.push_back(std::move(counts_used));
  const auto measured = window.End();

  result.peak_bytes.push_back(measured.peak_bytes);
  result.step_ms.push_back(measured.step_ms);
  result.losses.push_back(loss.defined() ? loss.item<double>() : std::numeric_limits<double>::quiet_NaN());
  result.aux_losses.push_back(loss.defined() ? aux_total : std::numeric_limits<double>::quiet_NaN());
}

RankResult PipelineTrainer::Train(const std::function<void(int64_t, const RankResult&)>& after_step) {
  RankResult result;
  result.rank = transport_.rank();
  result.replica = replica_;
  result.replicas = config_.data_parallel;
  for (const auto& stage : stages_) result.stages.push_back(stage->index);
  const int64_t first = config_.first_step;
  TORCH_CHECK(first == 0 || !config_.load_checkpoint.empty(), "a run that starts at step ", first,
              " needs a checkpoint to load");
  if (!config_.load_checkpoint.empty()) {
    LoadCheckpoint();
    result.loaded = LoadedState();
  }
  // The steps an earlier run trained: placeholders, so that every index is a step of the whole run.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto unset = static_cast<size_t>(std::max<int64_t>(0, first));
  result.first_step = first;
  for (auto* values : {&result.losses, &result.aux_losses, &result.step_ms}) values->assign(unset, nan);
  result.peak_bytes.assign(unset, -1);
  const bool recorded = config_.train.record_gradients;
  if (recorded) {
    result.weights.resize(unset);
    result.gradients.resize(unset);
    if (config_.train.model.expert_bias > 0.0) result.expert_biases.resize(unset), result.expert_counts.resize(unset);
    if (config_.train.model.HasExperts()) result.routing.resize(unset);
  }
  transport_.OpenChannels(MessageChannels(config_, schedule_));
  AlignClocks();
  for (int64_t step = first; step < config_.train.steps; ++step) {
    Step(step, result);
    if (after_step) after_step(step, result);
  }
  result.final_weights = WeightCopies();
  if (config_.train.model.expert_bias > 0.0) result.final_expert_biases = BiasCopies();
  if (!config_.save_checkpoint.empty()) SaveCheckpoint();  // before timing-only steps move anything
  RunTimingSteps(result);
  return result;
}

namespace {

// Stage `stage`'s share of a checkpoint, under checkpoint keys.
reference::NamedTensors StageState(const Stage& stage) {
  reference::NamedTensors state;
  for (const auto& item : stage.module->named_parameters()) {
    state.insert(CheckpointKey("weight", item.key()), item.value().detach());
    const auto saved = reference::StateOf(*stage.optimizer, item.value());
    if (!saved.present) continue;
    state.insert(CheckpointKey("exp_avg", item.key()), saved.exp_avg);
    state.insert(CheckpointKey("exp_avg_sq", item.key()), saved.exp_avg_sq);
    state.insert(CheckpointKey("step", item.key()), torch::scalar_tensor(saved.step, torch::kInt64));
  }
  for (const auto& item : stage.module->named_buffers()) {
    state.insert(CheckpointKey("expert_bias", item.key()), item.value().detach());
  }
  return state;
}

std::string LayoutInWords(const PipelineConfig& config) {
  return fmt::format("world_size {} schedule {} virtual_stages {} partition {} data_parallel {}", config.world_size,
                     config.schedule, config.virtual_stages, config.partition, config.data_parallel);
}

}  // namespace

void PipelineTrainer::SaveCheckpoint() const {
  const std::string& folder = config_.save_checkpoint;
  std::filesystem::create_directories(folder);
  const int stages = schedule_.shape.stages();
  if (replica_ == 0) {
    for (const auto& stage : stages_) {
      if (!seams_.tensors->WritesStageFile(stage->index, stages)) continue;
      WriteTensorFile((std::filesystem::path(folder) / StageFileName(stage->index)).string(), StageState(*stage));
    }
  }
  const bool first_stage = std::any_of(stages_.begin(), stages_.end(), [](const auto& s) { return s->index == 0; });
  if (first_stage) {
    reference::NamedTensors data;
    data.insert("next_step", torch::scalar_tensor(data_position_, torch::kInt64));
    data.insert("replica", torch::scalar_tensor(static_cast<int64_t>(config_.replica), torch::kInt64));
    data.insert("replicas", torch::scalar_tensor(static_cast<int64_t>(config_.data_parallel), torch::kInt64));
    WriteTensorFile((std::filesystem::path(folder) / DataFileName(replica_)).string(), data);
  }
}

void PipelineTrainer::CommitCheckpoint() const {
  const std::string& folder = config_.save_checkpoint;
  if (folder.empty()) return;
  const int stages = schedule_.shape.stages();
  std::vector<std::string> files;
  for (int s = 0; s < stages; ++s) {
    const std::string name = StageFileName(s);
    if (seams_.tensors->RequiresCompleteCheckpoint() || std::filesystem::exists(std::filesystem::path(folder) / name)) {
      files.push_back(name);
    }
  }
  for (int r = 0; r < config_.data_parallel; ++r) files.push_back(DataFileName(r));
  CheckpointManifest manifest;
  manifest.step = config_.train.steps;
  manifest.stages = stages;
  manifest.replicas = config_.data_parallel;
  manifest.layout = LayoutInWords(config_);
  WriteManifest(folder, manifest, files);
}

void PipelineTrainer::LoadCheckpoint() {
  const std::string& folder = config_.load_checkpoint;
  const auto& seams = *seams_.tensors;
  const auto manifest = ReadManifest(folder);  // none: its writers did not all finish
  if (manifest.step != config_.first_step) {
    throw CheckpointError(fmt::format("{}: a checkpoint after step {}, where this run starts at step {}", folder,
                                      manifest.step, config_.first_step));
  }
  if (seams.RequiresCompleteCheckpoint()) CheckComplete(folder, manifest);
  std::map<std::string, const CheckpointFile*> file_of;  // key -> the first file holding it
  for (const auto& file : manifest.files) {
    for (const auto& key : file.keys) file_of.emplace(key, &file);
  }
  std::map<std::string, reference::NamedTensors> read;  // file name -> its tensors, each verified once
  const auto tensors_of = [&](const CheckpointFile& file) -> const reference::NamedTensors& {
    auto found = read.find(file.name);
    if (found != read.end()) return found->second;
    VerifyFile(folder, file);
    return read.emplace(file.name, ReadTensorFile((std::filesystem::path(folder) / file.name).string())).first->second;
  };
  // The tensor saved under `key`; undefined where the checkpoint has none.
  const auto saved = [&](const std::string& key) -> torch::Tensor {
    const auto found = file_of.find(key);
    if (found == file_of.end()) return {};
    const auto& tensors = tensors_of(*found->second);
    return tensors.contains(key) ? tensors[key] : torch::Tensor();
  };
  torch::NoGradGuard no_grad;
  for (auto& stage : stages_) {
    // The saved stage of this index, for moments found by position.
    std::vector<std::string> positional;
    for (const auto& file : manifest.files) {
      if (file.name != StageFileName(stage->index)) continue;
      for (const auto& key : file.keys) {
        if (SplitCheckpointKey(key).first == "exp_avg") positional.push_back(SplitCheckpointKey(key).second);
      }
    }
    size_t position = 0;
    for (const auto& item : stage->module->named_parameters()) {
      const std::string& name = item.key();
      auto parameter = item.value();
      const bool tied_head_copy = config_.train.model.tied && name == "tok_embeddings.weight" &&
                                  stage->slice.has_head && !stage->slice.has_embedding;
      const auto weight = saved(CheckpointKey("weight", name));
      if (!weight.defined()) {
        if (seams.RequiresCompleteCheckpoint()) {
          throw CheckpointError(fmt::format("{}: holds no weight for {} (stage {}): the checkpoint is not of this model",
                                            folder, name, stage->index));
        }
      } else if (!tied_head_copy || seams.RestoresTiedHeadCopy()) {
        TORCH_CHECK(weight.sizes() == parameter.sizes(), folder, ": ", name, " is ", weight.sizes(), " there, ",
                    parameter.sizes(), " here");
        parameter.copy_(weight);
      }
      std::string moments_of = name;
      if (!seams.MomentsByName()) moments_of = position < positional.size() ? positional[position] : "";
      ++position;
      reference::ParameterState state;
      const auto exp_avg = saved(CheckpointKey("exp_avg", moments_of));
      if (exp_avg.defined() && exp_avg.sizes() != parameter.sizes() && seams.MomentsByName()) {
        throw CheckpointError(fmt::format("{}: the moments of {} are {} there, {} here", folder, name,
                                          c10::str(exp_avg.sizes()), c10::str(parameter.sizes())));
      }
      if (exp_avg.defined() && exp_avg.sizes() == parameter.sizes()) {
        state.present = true;
        state.exp_avg = exp_avg;
        state.exp_avg_sq = saved(CheckpointKey("exp_avg_sq", moments_of));
        state.step = seams.RestoresAdamStep() ? saved(CheckpointKey("step", moments_of)).item<int64_t>() : 0;
        TORCH_CHECK(state.exp_avg_sq.defined(), folder, ": ", moments_of, " has exp_avg but no exp_avg_sq");
      }
      if (tied_head_copy && !seams.RestoresTiedHeadCopy()) continue;
      reference::SetState(*stage->optimizer, parameter, state);
    }
    for (const auto& item : stage->module->named_buffers()) {
      const auto bias = saved(CheckpointKey("expert_bias", item.key()));
      if (bias.defined()) item.value().copy_(bias);
    }
  }
  // The data position: this replica's own where the replica count is unchanged, else the step
  // (every replica saved the same) with this rank's own share of each batch.
  const bool same_replicas = manifest.replicas == config_.data_parallel;
  const int source = same_replicas ? seams.DataReplicaToLoad(replica_, config_.data_parallel) : 0;
  const auto found = std::find_if(manifest.files.begin(), manifest.files.end(),
                                  [&](const CheckpointFile& f) { return f.name == DataFileName(source); });
  if (found == manifest.files.end()) {
    throw CheckpointError(fmt::format("{}: the manifest lists no {}", folder, DataFileName(source)));
  }
  const auto& data = tensors_of(*found);
  if (seams.RestoresDataPosition()) data_position_ = data["next_step"].item<int64_t>();
  else data_position_ = 0;
  if (same_replicas) config_.replica = static_cast<int>(data["replica"].item<int64_t>());
}

reference::NamedTensors PipelineTrainer::LoadedState() const {
  reference::NamedTensors state;
  for (const auto& stage : stages_) {
    for (const auto& item : StageState(*stage)) Record(state, item.key(), stage->index, item.value());
  }
  state.insert("data/next_step", torch::scalar_tensor(data_position_, torch::kInt64));
  state.insert("data/replica", torch::scalar_tensor(static_cast<int64_t>(config_.replica), torch::kInt64));
  return state;
}

void PipelineTrainer::RunTimingSteps(RankResult& result) {
  const int64_t steps = config_.train.steps;
  const int64_t run = steps - config_.first_step;  // this run's own steps (a resumed one starts later)
  const int64_t judged = run - static_cast<int64_t>(reference::FirstTimedStep(static_cast<size_t>(run)));
  if (!seams_.correct || config_.timed_samples <= judged || result.step_ms.empty()) return;
  // The pace: this rank's slowest timed judged step (the warm-up's where it is the only one).
  const auto first = result.step_ms.begin() + (judged > 0 ? steps - judged : config_.first_step);
  const double pace_ms = std::max(1e-3, *std::max_element(first, result.step_ms.end()));
  double count = std::min<double>(config_.timed_samples - judged, std::floor(kTimingBudgetMs / pace_ms));
  // Every rank runs the same count (each step is a collective of sends and receives).
  for (double proposed : transport_.AllGather(count)) count = std::min(count, proposed);
  if (replicas_ != nullptr) {
    for (double proposed : replicas_->AllGather(count)) count = std::min(count, proposed);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
    RankResult scratch;
    Step(steps - 1, scratch, /*judged=*/false);
    result.timing_step_ms.push_back(scratch.step_ms.back());
  }
}

}  // namespace pipecheck::pipeline
