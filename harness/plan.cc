// A scenario resolved once (see plan.h).
#include "harness/plan.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "harness/launcher.h"
#include "harness/runnable.h"
#include "harness/scenario_model.h"
#include "reports/csv.h"

namespace pipecheck::harness {
namespace {

using nlohmann::json;

// The plan file's format; a reader refuses any other.
constexpr int kPlanFormat = 3;

json ScheduleJson(const pipeline::Schedule& schedule) {
  json ranks = json::array();
  for (const auto& actions : schedule.ranks) {
    json list = json::array();
    for (const auto& action : actions) list.push_back(action.ToString());
    ranks.push_back(std::move(list));
  }
  const auto& shape = schedule.shape;
  return {{"name", schedule.name}, {"ranks", shape.ranks}, {"virtual_stages", shape.virtual_stages},
          {"microbatches", shape.microbatches}, {"placement", shape.placement == pipeline::Placement::kV ? "v" : "round_robin"},
          {"actions", std::move(ranks)}};
}

pipeline::Schedule ScheduleOf(const json& j) {
  pipeline::Schedule schedule;
  schedule.name = j.at("name").get<std::string>();
  schedule.shape.ranks = j.at("ranks").get<int>();
  schedule.shape.virtual_stages = j.at("virtual_stages").get<int>();
  schedule.shape.microbatches = j.at("microbatches").get<int>();
  schedule.shape.placement = j.at("placement").get<std::string>() == "v" ? pipeline::Placement::kV
                                                                        : pipeline::Placement::kRoundRobin;
  for (const auto& list : j.at("actions")) {
    schedule.ranks.emplace_back();
    for (const auto& action : list) schedule.ranks.back().push_back(pipeline::ParseAction(action.get<std::string>()));
  }
  return schedule;
}

json SimulationJson(const pipeline::SimulationResult& s) {
  return {{"ok", s.ok}, {"error", s.error}, {"grid", s.grid}, {"makespan", s.makespan}, {"finish", s.finish},
          {"bubble", s.bubble}, {"busy", s.busy}, {"peak_in_flight", s.peak_in_flight},
          {"start_times", s.start_times}, {"stuck_at", s.stuck_at}};
}

pipeline::SimulationResult SimulationOf(const json& j) {
  pipeline::SimulationResult s;
  j.at("ok").get_to(s.ok);
  j.at("error").get_to(s.error);
  j.at("grid").get_to(s.grid);
  j.at("makespan").get_to(s.makespan);
  j.at("finish").get_to(s.finish);
  j.at("bubble").get_to(s.bubble);
  j.at("busy").get_to(s.busy);
  j.at("peak_in_flight").get_to(s.peak_in_flight);
  j.at("start_times").get_to(s.start_times);
  j.at("stuck_at").get_to(s.stuck_at);
  return s;
}

json MemoryJson(const std::vector<pipeline::MemoryPrediction>& memory) {
  json replicas = json::array();
  for (const auto& m : memory) {
    replicas.push_back({{"peak_bytes", m.peak_bytes},
                        {"params", m.params},
                        {"held_after", m.held_after},
                        {"peak_during", m.peak_during}});
  }
  return replicas;
}

std::vector<pipeline::MemoryPrediction> MemoryOf(const json& j) {
  std::vector<pipeline::MemoryPrediction> memory;
  for (const auto& replica : j) {
    pipeline::MemoryPrediction m;
    replica.at("peak_bytes").get_to(m.peak_bytes);
    replica.at("params").get_to(m.params);
    replica.at("held_after").get_to(m.held_after);
    replica.at("peak_during").get_to(m.peak_during);
    memory.push_back(std::move(m));
  }
  return memory;
}

// Where the row came from, which a one-row suite's parse cannot know: its file and line, where
// its file's columns sit, and its paths as resolved against the suite's folder.
json OriginJson(const scenarios::Scenario& s) {
  return {{"source", s.source}, {"column_positions", s.column_positions}, {"schedule", s.schedule},
          {"schedule_written", s.schedule_written}, {"trainer_path", s.trainer_path}};
}

void RestoreOrigin(const json& j, scenarios::Scenario& s) {
  j.at("source").get_to(s.source);
  j.at("column_positions").get_to(s.column_positions);
  j.at("schedule").get_to(s.schedule);
  j.at("schedule_written").get_to(s.schedule_written);
  j.at("trainer_path").get_to(s.trainer_path);
}

// The row as a one-row suite, parsed as its suite's loader parsed it but without checking the
// schedule again: the plan holds it, checked.
scenarios::Scenario ScenarioOf(const std::string& row, const std::string& device, const std::string& file) {
  scenarios::Vocabulary vocabulary = PipelineVocabulary();
  vocabulary.schedule_problem = nullptr;
  vocabulary.device = device;
  auto parsed = scenarios::ParseScenarios(row, file, vocabulary);
  if (parsed.size() != 1) {
    throw scenarios::ScenarioError(fmt::format("{}: a plan holds one scenario, this one {}", file, parsed.size()));
  }
  return parsed.front();
}

}  // namespace

Plan ResolvePlan(const scenarios::Scenario& scenario) {
  Plan plan;
  plan.scenario = scenario;
  plan.deadline_seconds = DefaultDeadlineSeconds(scenario);
  plan.unmet = UnmetRequirement(scenario);
  if (scenario.ExternalTrainer()) {
    plan.config = ExternalTrainerView(scenario);
    if (!plan.unmet.empty()) return plan;
    try {
      plan.schedule = pipeline::BuildSchedule(plan.config);
    } catch (const pipeline::ScheduleError& error) {
      plan.error = error.what();
    }
    return plan;
  }
  plan.transport = ResolveTransport(scenario);
  plan.config = ToPipelineConfig(scenario, plan.transport);
  if (!plan.unmet.empty()) return plan;
  try {
    plan.schedule = pipeline::BuildSchedule(plan.config);
    plan.simulation =
        pipeline::ValidateSchedule(plan.schedule, pipeline::UnitCosts(plan.config), plan.config.communication);
  } catch (const pipeline::ScheduleError& error) {
    plan.schedule = {};
    plan.error = error.what();
    return plan;
  }
  for (int replica = 0; replica < plan.config.data_parallel; ++replica) {
    auto replica_config = plan.config;
    replica_config.replica = replica;
    plan.memory.push_back(pipeline::PredictMemory(replica_config, plan.schedule));
  }
  return plan;
}

void ApplySegment(Plan& plan) {
  plan.config.first_step = plan.segment.first_step;
  plan.config.load_checkpoint = plan.segment.load_checkpoint;
  plan.config.save_checkpoint = plan.segment.save_checkpoint;
}

std::string PlanToJson(const Plan& plan) {
  json j = {{"pipecheck_plan", kPlanFormat},
            {"scenario", scenarios::ToCsv({plan.scenario})},
            {"device", plan.scenario.device},
            {"origin", OriginJson(plan.scenario)},
            {"transport", plan.transport},
            {"deadline_seconds", plan.deadline_seconds},
            {"unmet", plan.unmet},
            {"error", plan.error},
            {"schedule", ScheduleJson(plan.schedule)},
            {"simulation", SimulationJson(plan.simulation)},
            {"memory", MemoryJson(plan.memory)},
            {"segment", {{"index", plan.segment.index}, {"count", plan.segment.count},
                         {"first_step", plan.segment.first_step}, {"load_checkpoint", plan.segment.load_checkpoint},
                         {"save_checkpoint", plan.segment.save_checkpoint},
                         {"judge_state_in", plan.segment.judge_state_in},
                         {"judge_state_out", plan.segment.judge_state_out}}}};
  return j.dump() + "\n";
}

Plan PlanFromJson(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& error) {
    throw scenarios::ScenarioError(fmt::format("{}: not a plan (JSON): {}", file, error.what()));
  }
  if (!j.is_object() || !j.contains("pipecheck_plan") || j["pipecheck_plan"] != kPlanFormat) {
    throw scenarios::ScenarioError(
        fmt::format("{}: not a pipecheck plan of format {} (`pipecheck run` writes them)", file, kPlanFormat));
  }
  try {
    Plan plan;
    plan.scenario = ScenarioOf(j.at("scenario").get<std::string>(), j.at("device").get<std::string>(), file);
    RestoreOrigin(j.at("origin"), plan.scenario);
    j.at("transport").get_to(plan.transport);
    j.at("deadline_seconds").get_to(plan.deadline_seconds);
    j.at("unmet").get_to(plan.unmet);
    j.at("error").get_to(plan.error);
    plan.schedule = ScheduleOf(j.at("schedule"));
    plan.simulation = SimulationOf(j.at("simulation"));
    plan.memory = MemoryOf(j.at("memory"));
    plan.config = plan.scenario.ExternalTrainer() ? ExternalTrainerView(plan.scenario) : ToPipelineConfig(plan.scenario, plan.transport);
    const auto& segment = j.at("segment");
    segment.at("index").get_to(plan.segment.index);
    segment.at("count").get_to(plan.segment.count);
    segment.at("first_step").get_to(plan.segment.first_step);
    segment.at("load_checkpoint").get_to(plan.segment.load_checkpoint);
    segment.at("save_checkpoint").get_to(plan.segment.save_checkpoint);
    segment.at("judge_state_in").get_to(plan.segment.judge_state_in);
    segment.at("judge_state_out").get_to(plan.segment.judge_state_out);
    ApplySegment(plan);
    return plan;
  } catch (const json::exception& error) {
    throw scenarios::ScenarioError(fmt::format("{}: a plan missing a part or of the wrong type: {}", file, error.what()));
  } catch (const pipeline::ScheduleError& error) {
    throw scenarios::ScenarioError(fmt::format("{}: the plan's schedule does not parse: {}", file, error.what()));
  }
}

void WritePlan(const Plan& plan, const std::string& path) { reports::WriteFileAtomically(path, PlanToJson(plan)); }

Plan ReadPlan(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw scenarios::ScenarioError(fmt::format("{}: cannot open the plan", path));
  std::stringstream text;
  text << stream.rdbuf();
  return PlanFromJson(text.str(), path);
}

}  // namespace pipecheck::harness
